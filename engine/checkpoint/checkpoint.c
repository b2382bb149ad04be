/* A checkpoint directory: one safetensors file or shards listed by
 * model.safetensors.index.json, behind one name index that accepts both key
 * layouts of engine/model/README.md §6. */
#include <assert.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/mapped_file.h"
#include "checkpoint/safetensors.h"

#define NAME_IN_MSG "%.200s"

/* transformers >= 4.52 prefix -> hub prefix
 * (MllamaForConditionalGeneration._checkpoint_conversion_mapping). */
static const struct {
    const char *from, *to;
} aliases[] = {
    {"model.language_model.", "language_model.model."},
    {"model.vision_model.", "vision_model."},
    {"model.multi_modal_projector.", "multi_modal_projector."},
    {"lm_head.", "language_model.lm_head."},
};

typedef struct ck_entry {
    const char *canonical;      /* points into ml_checkpoint.names */
    const ml_tensor_view *view; /* borrowed from shards[shard] */
    int shard;
} ck_entry;

struct ml_checkpoint {
    int n_shards;
    ml_safetensors **shards; /* owned (n_shards) */
    size_t n;
    ck_entry *entries; /* owned (n), sorted by canonical name */
    char *names;       /* owned pool of the canonical names */
};

/* ---- canonical names --------------------------------------------------- */

/* The canonical form of name is *prefix followed by *rest. */
static void split_canonical(const char *name, const char **prefix, const char **rest)
{
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++) {
        size_t len = strlen(aliases[i].from);
        if (!strncmp(name, aliases[i].from, len)) {
            *prefix = aliases[i].to;
            *rest = name + len;
            return;
        }
    }
    *prefix = "";
    *rest = name;
}

size_t ml_checkpoint_canonical_name(const char *name, char *out, size_t n)
{
    const char *prefix, *rest;
    split_canonical(name, &prefix, &rest);
    int len = snprintf(out, n, "%s%s", prefix, rest);
    return len < 0 ? 0 : (size_t)len;
}

/* strcmp(prefix + rest, s) without building the concatenation. */
static int cmp_split(const char *prefix, const char *rest, const char *s)
{
    for (; *prefix; prefix++, s++)
        if (*prefix != *s)
            return (unsigned char)*prefix - (unsigned char)*s;
    return strcmp(rest, s);
}

static int cmp_entries(const void *a, const void *b)
{
    return strcmp(((const ck_entry *)a)->canonical, ((const ck_entry *)b)->canonical);
}

/* ---- opening ----------------------------------------------------------- */

/* dir + "/" + name, malloc'd, or NULL. */
static char *join_path(const char *dir, const char *name)
{
    size_t n = strlen(dir) + 1 + strlen(name) + 1;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static ml_status open_shard(ml_safetensors **out, const char *dir, const char *name, char *err,
                            size_t errlen)
{
    char *path = join_path(dir, name);
    if (!path)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "%s: out of memory", dir);
    ml_status rc = ml_safetensors_open(out, path, err, errlen);
    free(path);
    return rc;
}

/* A shard name from index.json must stay inside the checkpoint directory. */
static int is_plain_file_name(const char *s)
{
    return s[0] && strcmp(s, ".") && strcmp(s, "..") && !strchr(s, '/');
}

static int cmp_str_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Open the shards that the weight_map names and check that each mapped
 * tensor is where the map says. */
static ml_status open_sharded(ml_checkpoint *ck, const char *dir, const char *index_path,
                              const cJSON *map, char *err, size_t errlen)
{
    int m = cJSON_GetArraySize(map);
    if (m == 0)
        return ml_fail(err, errlen, ML_ERR_FORMAT, "%s: weight_map is empty", index_path);
    const char **files = malloc((size_t)m * sizeof *files);
    if (!files)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "%s: out of memory", index_path);
    ml_status rc = ML_OK;
    int k = 0;
    for (const cJSON *e = map->child; e && rc == ML_OK; e = e->next) {
        if (!cJSON_IsString(e))
            rc = ml_fail(err, errlen, ML_ERR_FORMAT,
                         "%s: weight_map['" NAME_IN_MSG "'] is not a file name", index_path,
                         e->string);
        else if (!is_plain_file_name(e->valuestring))
            rc = ml_fail(err, errlen, ML_ERR_FORMAT,
                         "%s: weight_map['" NAME_IN_MSG "']: shard \"" NAME_IN_MSG
                         "\" is not a plain file name in the checkpoint directory",
                         index_path, e->string, e->valuestring);
        else
            files[k++] = e->valuestring;
    }
    /* Distinct shard names, sorted, so each is opened once and found by
     * bsearch. */
    int n_files = 0;
    if (rc == ML_OK) {
        qsort(files, (size_t)k, sizeof *files, cmp_str_ptr);
        for (int i = 0; i < k; i++)
            if (n_files == 0 || strcmp(files[n_files - 1], files[i]))
                files[n_files++] = files[i];
        if (n_files > ML_CHECKPOINT_MAX_SHARDS)
            rc = ml_fail(err, errlen, ML_ERR_TOO_LARGE, "%s: %d shard files exceed the limit %d",
                         index_path, n_files, ML_CHECKPOINT_MAX_SHARDS);
    }
    if (rc == ML_OK) {
        ck->shards = calloc((size_t)n_files, sizeof *ck->shards);
        if (!ck->shards)
            rc = ml_fail(err, errlen, ML_ERR_NOMEM, "%s: out of memory", index_path);
    }
    for (int i = 0; i < n_files && rc == ML_OK; i++) {
        rc = open_shard(&ck->shards[i], dir, files[i], err, errlen);
        ck->n_shards = i + 1;
    }
    for (const cJSON *e = map->child; e && rc == ML_OK; e = e->next) {
        const char *file = e->valuestring;
        const char **hit = bsearch(&file, files, (size_t)n_files, sizeof *files, cmp_str_ptr);
        assert(hit); /* files holds every name of the map */
        if (!ml_safetensors_find(ck->shards[hit - files], e->string))
            rc = ml_fail(err, errlen, ML_ERR_FORMAT,
                         "%s: weight_map puts tensor '" NAME_IN_MSG "' in %s, which does not "
                         "contain it",
                         index_path, e->string, file);
    }
    free(files);
    return rc;
}

static ml_status open_index(ml_checkpoint *ck, const char *dir, char *err, size_t errlen)
{
    char *path = join_path(dir, ML_CHECKPOINT_INDEX_FILE);
    if (!path)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "%s: out of memory", dir);
    ml_mapped_file mf;
    ml_status rc = ml_mapped_file_init(&mf, path, ML_SAFETENSORS_MAX_HEADER, err, errlen);
    if (rc == ML_ERR_NOT_FOUND)
        rc = ml_fail(err, errlen, ML_ERR_NOT_FOUND, "%s: neither %s nor %s found", dir,
                     ML_CHECKPOINT_SINGLE_FILE, ML_CHECKPOINT_INDEX_FILE);
    cJSON *root = NULL;
    if (rc == ML_OK) {
        root = mf.size ? cJSON_ParseWithLength((const char *)mf.data, mf.size) : NULL;
        const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
        if (!cJSON_IsObject(root))
            rc = ml_fail(err, errlen, ML_ERR_FORMAT, "%s: not a JSON object", path);
        else if (!cJSON_IsObject(map))
            rc = ml_fail(err, errlen, ML_ERR_FORMAT, "%s: no \"weight_map\" object", path);
        else
            rc = open_sharded(ck, dir, path, map, err, errlen);
    }
    cJSON_Delete(root);
    ml_mapped_file_deinit(&mf);
    free(path);
    return rc;
}

/* The canonical-name index over every shard's tensors. */
static ml_status build_index(ml_checkpoint *ck, const char *dir, char *err, size_t errlen)
{
    size_t n = 0, bytes = 0;
    for (int s = 0; s < ck->n_shards; s++) {
        size_t c = ml_safetensors_count(ck->shards[s]);
        n += c;
        for (size_t i = 0; i < c; i++)
            bytes += ml_checkpoint_canonical_name(ml_safetensors_tensor(ck->shards[s], i)->name,
                                                  NULL, 0) +
                     1;
    }
    ck->entries = malloc((n ? n : 1) * sizeof *ck->entries);
    ck->names = malloc(bytes ? bytes : 1);
    if (!ck->entries || !ck->names)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "%s: out of memory for %zu tensor names", dir, n);
    char *p = ck->names;
    for (int s = 0; s < ck->n_shards; s++) {
        for (size_t i = 0; i < ml_safetensors_count(ck->shards[s]); i++) {
            const ml_tensor_view *t = ml_safetensors_tensor(ck->shards[s], i);
            size_t len = ml_checkpoint_canonical_name(t->name, p, (size_t)(ck->names + bytes - p));
            ck->entries[ck->n++] = (ck_entry){p, t, s};
            p += len + 1;
        }
    }
    qsort(ck->entries, ck->n, sizeof *ck->entries, cmp_entries);
    for (size_t i = 1; i < ck->n; i++) {
        const ck_entry *a = &ck->entries[i - 1], *b = &ck->entries[i];
        if (!strcmp(a->canonical, b->canonical))
            return ml_fail(err, errlen, ML_ERR_FORMAT,
                           "%s: tensor '" NAME_IN_MSG "' appears twice: as '" NAME_IN_MSG
                           "' in %s and as '" NAME_IN_MSG "' in %s",
                           dir, a->canonical, a->view->name,
                           ml_safetensors_label(ck->shards[a->shard]), b->view->name,
                           ml_safetensors_label(ck->shards[b->shard]));
    }
    return ML_OK;
}

ml_status ml_checkpoint_open(ml_checkpoint **out, const char *dir, char *err, size_t errlen)
{
    *out = NULL;
    ml_checkpoint *ck = calloc(1, sizeof *ck);
    if (!ck)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "%s: out of memory", dir);
    ml_status rc;
    ml_safetensors *single = NULL;
    rc = open_shard(&single, dir, ML_CHECKPOINT_SINGLE_FILE, err, errlen);
    if (rc == ML_OK) {
        ck->shards = malloc(sizeof *ck->shards);
        if (ck->shards) {
            ck->shards[0] = single;
            ck->n_shards = 1;
        } else {
            ml_safetensors_destroy(single);
            rc = ml_fail(err, errlen, ML_ERR_NOMEM, "%s: out of memory", dir);
        }
    } else if (rc == ML_ERR_NOT_FOUND) {
        rc = open_index(ck, dir, err, errlen);
    }
    if (rc == ML_OK)
        rc = build_index(ck, dir, err, errlen);
    if (rc != ML_OK) {
        ml_checkpoint_destroy(ck);
        return rc;
    }
    *out = ck;
    return ML_OK;
}

void ml_checkpoint_destroy(ml_checkpoint *ck)
{
    if (!ck)
        return;
    for (int i = 0; i < ck->n_shards; i++)
        ml_safetensors_destroy(ck->shards[i]);
    free(ck->shards);
    free(ck->entries);
    free(ck->names);
    free(ck);
}

/* ---- lookup ------------------------------------------------------------ */

size_t ml_checkpoint_count(const ml_checkpoint *ck)
{
    return ck->n;
}

const ml_tensor_view *ml_checkpoint_tensor(const ml_checkpoint *ck, size_t i,
                                           const char **canonical)
{
    if (i >= ck->n)
        return NULL;
    if (canonical)
        *canonical = ck->entries[i].canonical;
    return ck->entries[i].view;
}

const ml_tensor_view *ml_checkpoint_find(const ml_checkpoint *ck, const char *name)
{
    const char *prefix, *rest;
    split_canonical(name, &prefix, &rest);
    size_t lo = 0, hi = ck->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = cmp_split(prefix, rest, ck->entries[mid].canonical);
        if (c == 0)
            return ck->entries[mid].view;
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

int ml_checkpoint_n_shards(const ml_checkpoint *ck)
{
    return ck->n_shards;
}
