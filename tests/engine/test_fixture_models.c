/* Loads every golden fixture model under tests/golden/fixtures/models/<name>/
 * (tiny random Mllama checkpoints saved by transformers): config.json parses,
 * the checkpoint opens (single file or sharded), every tensor of the model
 * binds with the config's shapes and none is left over; the model's
 * reference.safetensors (F32/I64 reference tensors) opens and every tensor
 * reads back, floats finite. Skips (77) while no fixture model exists. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "harness.h"
#include "checkpoint/config.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/weights.h"

#define ERRLEN 512
#define MODELS ML_SOURCE_DIR "/tests/golden/fixtures/models"
#define MAX_MODELS 64
#define PATH_LEN 1024

static int is_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static void check_reference(const char *path)
{
    char err[ERRLEN];
    ml_safetensors *st = NULL;
    ml_status rc = ml_safetensors_open(&st, path, err, ERRLEN);
    check(rc == ML_OK, "open %s: %s", path, err);
    if (!st)
        return;
    size_t n = ml_safetensors_count(st);
    check(n > 0, "%s has tensors", path);
    size_t nonfinite = 0;
    for (size_t i = 0; i < n; i++) {
        const ml_tensor_view *t = ml_safetensors_tensor(st, i);
        size_t numel = (size_t)ml_tensor_view_numel(t);
        if (t->dtype == ML_DTYPE_F32 || t->dtype == ML_DTYPE_BF16 || t->dtype == ML_DTYPE_F16) {
            float *f = malloc((numel ? numel : 1) * sizeof *f);
            rc = f ? ml_tensor_view_read_f32(t, f, err, ERRLEN) : ML_ERR_NOMEM;
            check(rc == ML_OK, "%s: read %s: %s", path, t->name, err);
            for (size_t j = 0; f && rc == ML_OK && j < numel; j++)
                nonfinite += !isfinite(f[j]);
            free(f);
        } else {
            int64_t *v = malloc((numel ? numel : 1) * sizeof *v);
            rc = v ? ml_tensor_view_read_i64(t, v, err, ERRLEN) : ML_ERR_NOMEM;
            check(rc == ML_OK, "%s: read %s: %s", path, t->name, err);
            free(v);
        }
    }
    /* Masks use finfo.min, a finite value; NaN/inf would be a generator bug. */
    check(nonfinite == 0, "%s: %zu non-finite reference values", path, nonfinite);
    fprintf(stderr, "  %-48s %zu reference tensors\n", strrchr(path, '/') + 1, n);
    ml_safetensors_destroy(st);
}

static void check_model(const char *name)
{
    char dir[PATH_LEN], path[PATH_LEN + 64], err[ERRLEN];
    snprintf(dir, sizeof dir, "%s/%s", MODELS, name);
    ml_config cfg;
    snprintf(path, sizeof path, "%s/config.json", dir);
    ml_status rc = ml_config_load(&cfg, path, err, ERRLEN);
    check(rc == ML_OK, "%s: %s", name, err);
    if (rc != ML_OK)
        return;
    ml_checkpoint *ck = NULL;
    rc = ml_checkpoint_open(&ck, dir, err, ERRLEN);
    check(rc == ML_OK, "%s: %s", name, err);
    ml_weights *w = NULL;
    if (ck) {
        rc = ml_weights_create(&w, ck, &cfg, err, ERRLEN);
        check(rc == ML_OK, "%s: %s", name, err);
    }
    if (w) {
        check(w->n_unused == 0, "%s: %zu checkpoint tensors not part of the model", name,
              w->n_unused);
        char line[256];
        fprintf(stderr, "  %-24s %d shard(s), text %d layers (%d cross), vision %d+%d: %s\n", name,
                ml_checkpoint_n_shards(ck), cfg.text.num_hidden_layers, cfg.text.n_cross_layers,
                cfg.vision.num_hidden_layers, cfg.vision.num_global_layers,
                ml_weights_summary(w, line, sizeof line));
    }
    ml_weights_destroy(w);
    ml_checkpoint_destroy(ck);

    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    if (is_file(path))
        check_reference(path);
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(void)
{
    DIR *d = opendir(MODELS);
    if (!d)
        ml_test_skip("no fixture models yet (" MODELS ")");
    char *names[MAX_MODELS];
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) && n < MAX_MODELS;) {
        char path[PATH_LEN + 64];
        snprintf(path, sizeof path, "%s/%s/config.json", MODELS, e->d_name);
        if (e->d_name[0] != '.' && is_file(path))
            names[n++] = strdup(e->d_name);
    }
    closedir(d);
    if (n == 0)
        ml_test_skip("no fixture models yet (no " MODELS "/*/config.json)");
    qsort(names, (size_t)n, sizeof *names, cmp_names);
    for (int i = 0; i < n; i++) {
        check(names[i] != NULL, "out of memory");
        if (names[i])
            check_model(names[i]);
        free(names[i]);
    }
    return check_done();
}
