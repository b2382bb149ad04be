/* Random-weight checkpoints (mkmodel.h). The tensor list comes from
 * ml_weights_manifest, so what is written is exactly what the loader binds. */
#include "checkpoint/mkmodel.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint/config.h"
#include "checkpoint/fp8_quant.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/weights.h"
#include "dtype.h"

/* save_pretrained shards at 5 GB (max_shard_size="5GB", transformers 4.47
 * modeling_utils.py): a header-only checkpoint, which stands in for a
 * published one, is split there; smaller shards keep demo copies cheap. */
#define HUB_SHARD_BYTES (5000ull * 1000 * 1000)
#define SHARD_BYTES (2000ull * 1000 * 1000)
#define MAX_LIST 40

/* The published Llama 3.2 Vision constants shared by every preset. */
#define VOCAB 128256
#define IMAGE_TOKEN 128256
#define BOS 128000
#define PAD 128004
#define ROPE_THETA 500000.0
#define MAX_POSITIONS 131072
#define TILE 560
#define PATCH 14
#define MAX_TILES 4

typedef struct preset {
    const char *name;
    int header_only; /* its random values would not fit a development machine */
    int tile;
    int v_hidden, v_heads, v_inter, v_layers, v_global;
    int n_inter, inter[MAX_LIST];
    int t_hidden, t_heads, t_kv, t_inter, t_layers;
    int n_cross, cross[MAX_LIST];
} preset;

static const preset presets[] = {
    /* 56-pixel tiles (4 patches + CLS, padded to 8): a whole image costs
     * milliseconds, for service tests that need many requests. */
    {"micro", 0, 56, 32, 2, 64, 2, 1, 1, {1}, 64, 2, 1, 128, 3, 1, {1}},
    {"tiny", 0, TILE, 64, 2, 256, 4, 2, 2, {1, 3}, 256, 4, 2, 768, 5, 1, {2}},
    {"small", 0, TILE, 256, 4, 1024, 8, 2, 3, {2, 5, 7}, 1024, 8, 2, 2816, 10, 2, {3, 8}},
    /* Llama 3.2 1B's decoder widths; vision layers of the real width. */
    {"1b", 0, TILE, 1280, 16, 5120, 8, 2, 5, {1, 3, 5, 6, 7}, 2048, 32, 8, 8192, 16, 3, {3, 8, 13}},
    {"11b", 0, TILE, 1280, 16, 5120, 32, 8, 5, {3, 7, 15, 23, 30}, 4096, 32, 8, 14336, 40, 8,
     {3, 8, 13, 18, 23, 28, 33, 38}},
    /* Llama-3.2-90B-Vision(-Instruct) config.json: the 11B vision tower;
     * text hidden 8192, intermediate 28672, 100 layers, 64 heads, 8 K/V
     * heads, a cross-attention layer every 5 from 3 (20 of them). The same
     * shapes as the docs' model facts (performance notes §1: 88.6 B
     * parameters, 177 GB in bf16). */
    {"90b", 1, TILE, 1280, 16, 5120, 32, 8, 5, {3, 7, 15, 23, 30}, 8192, 64, 8, 28672, 100, 20,
     {3, 8, 13, 18, 23, 28, 33, 38, 43, 48, 53, 58, 63, 68, 73, 78, 83, 88, 93, 98}},
};

const char *const ml_mkmodel_presets[] = {"micro", "tiny", "small", "1b", "11b", "90b", NULL};

/* ---- files -------------------------------------------------------------- */

static ml_status write_file(const char *path, const void *data, size_t len, char *err,
                            size_t errlen)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return ml_fail(err, errlen, ML_ERR_IO, "%s: %s", path, strerror(errno));
    int ok = fwrite(data, 1, len, f) == len;
    ok &= fclose(f) == 0;
    return ok ? ML_OK : ml_fail(err, errlen, ML_ERR_IO, "%s: write failed", path);
}

static ml_status copy_file(const char *from, const char *to, char *err, size_t errlen)
{
    FILE *f = fopen(from, "rb");
    if (!f)
        return ml_fail(err, errlen, ML_ERR_IO, "%s: %s", from, strerror(errno));
    struct stat st;
    char *buf = NULL;
    size_t n = 0;
    if (fstat(fileno(f), &st) == 0 && (buf = malloc((size_t)st.st_size + 1)))
        n = fread(buf, 1, (size_t)st.st_size, f);
    fclose(f);
    if (!buf || n != (size_t)st.st_size) {
        free(buf);
        return ml_fail(err, errlen, ML_ERR_IO, "%s: read failed", from);
    }
    ml_status rc = write_file(to, buf, n, err, errlen);
    free(buf);
    return rc;
}

static ml_status write_json(const char *path, cJSON *o, char *err, size_t errlen)
{
    char *s = cJSON_Print(o);
    ml_status rc = s ? write_file(path, s, strlen(s), err, errlen)
                     : ml_fail(err, errlen, ML_ERR_NOMEM, "%s: out of memory", path);
    free(s);
    return rc;
}

static cJSON *int_array(const int *v, int n)
{
    return cJSON_CreateIntArray(v, n);
}

/* config.json as MllamaConfig.to_json_string writes it (all fields). */
static cJSON *config_json(const preset *p)
{
    static const int aspect[][2] = {{1, 1}, {1, 2}, {1, 3}, {1, 4}, {2, 1}, {2, 2}, {3, 1}, {4, 1}};
    static const int eos[] = {128001, 128008, 128009};
    cJSON *c = cJSON_CreateObject();
    cJSON_AddItemToObject(c, "architectures",
                          cJSON_CreateStringArray((const char *[]){"MllamaForConditionalGeneration"}, 1));
    cJSON_AddStringToObject(c, "model_type", "mllama");
    cJSON_AddNumberToObject(c, "image_token_index", IMAGE_TOKEN);
    cJSON_AddStringToObject(c, "torch_dtype", "bfloat16");

    cJSON *v = cJSON_AddObjectToObject(c, "vision_config");
    cJSON_AddStringToObject(v, "model_type", "mllama_vision_model");
    cJSON_AddNumberToObject(v, "hidden_size", p->v_hidden);
    cJSON_AddNumberToObject(v, "attention_heads", p->v_heads);
    cJSON_AddNumberToObject(v, "intermediate_size", p->v_inter);
    cJSON_AddNumberToObject(v, "num_hidden_layers", p->v_layers);
    cJSON_AddNumberToObject(v, "num_global_layers", p->v_global);
    cJSON_AddStringToObject(v, "hidden_act", "gelu");
    cJSON_AddNumberToObject(v, "image_size", p->tile);
    cJSON_AddNumberToObject(v, "patch_size", PATCH);
    cJSON_AddNumberToObject(v, "num_channels", 3);
    cJSON_AddNumberToObject(v, "norm_eps", 1e-5);
    cJSON_AddNumberToObject(v, "max_num_tiles", MAX_TILES);
    cJSON *ar = cJSON_AddArrayToObject(v, "supported_aspect_ratios");
    for (size_t i = 0; i < sizeof aspect / sizeof aspect[0]; i++)
        cJSON_AddItemToArray(ar, int_array(aspect[i], 2));
    cJSON_AddItemToObject(v, "intermediate_layers_indices", int_array(p->inter, p->n_inter));
    cJSON_AddNumberToObject(v, "vision_output_dim", p->v_hidden * (1 + p->n_inter));

    cJSON *t = cJSON_AddObjectToObject(c, "text_config");
    cJSON_AddStringToObject(t, "model_type", "mllama_text_model");
    cJSON_AddNumberToObject(t, "vocab_size", VOCAB);
    cJSON_AddNumberToObject(t, "hidden_size", p->t_hidden);
    cJSON_AddNumberToObject(t, "intermediate_size", p->t_inter);
    cJSON_AddNumberToObject(t, "num_hidden_layers", p->t_layers);
    cJSON_AddNumberToObject(t, "num_attention_heads", p->t_heads);
    cJSON_AddNumberToObject(t, "num_key_value_heads", p->t_kv);
    cJSON_AddItemToObject(t, "cross_attention_layers", int_array(p->cross, p->n_cross));
    cJSON_AddNumberToObject(t, "rms_norm_eps", 1e-5);
    cJSON_AddNumberToObject(t, "rope_theta", ROPE_THETA);
    cJSON *rs = cJSON_AddObjectToObject(t, "rope_scaling");
    cJSON_AddStringToObject(rs, "rope_type", "llama3");
    cJSON_AddNumberToObject(rs, "factor", 8.0);
    cJSON_AddNumberToObject(rs, "low_freq_factor", 1.0);
    cJSON_AddNumberToObject(rs, "high_freq_factor", 4.0);
    cJSON_AddNumberToObject(rs, "original_max_position_embeddings", 8192);
    cJSON_AddNumberToObject(t, "max_position_embeddings", MAX_POSITIONS);
    cJSON_AddStringToObject(t, "hidden_act", "silu");
    cJSON_AddBoolToObject(t, "tie_word_embeddings", 0);
    cJSON_AddNumberToObject(t, "bos_token_id", BOS);
    cJSON_AddNumberToObject(t, "pad_token_id", PAD);
    cJSON_AddItemToObject(t, "eos_token_id", int_array(eos, 3));
    return c;
}

/* quantization_config of the published FP8-dynamic checkpoints, as
 * compressed-tensors 0.8.1 serialises it (QuantizationConfig.model_dump of
 * preset_name_to_scheme("FP8_DYNAMIC", ["Linear"]); unset fields null) with
 * the ignore list of llm-compressor's mllama FP8 example, which the
 * published checkpoints carry. */
static void add_fp8_config(cJSON *c)
{
    static const char *const ignore[] = {"re:.*lm_head", "re:multi_modal_projector.*",
                                         "re:vision_model.*"};
    cJSON *q = cJSON_AddObjectToObject(c, "quantization_config");
    cJSON *g = cJSON_AddObjectToObject(cJSON_AddObjectToObject(q, "config_groups"), "group_0");
    cJSON_AddItemToObject(g, "targets", cJSON_CreateStringArray((const char *[]){"Linear"}, 1));
    static const struct {
        const char *key, *strategy, *observer;
        int dynamic;
    } args[] = {{"weights", "channel", "minmax", 0}, {"input_activations", "token", NULL, 1}};
    for (size_t i = 0; i < sizeof args / sizeof args[0]; i++) {
        cJSON *a = cJSON_AddObjectToObject(g, args[i].key);
        cJSON_AddNumberToObject(a, "num_bits", 8);
        cJSON_AddStringToObject(a, "type", "float");
        cJSON_AddBoolToObject(a, "symmetric", 1);
        cJSON_AddStringToObject(a, "strategy", args[i].strategy);
        cJSON_AddBoolToObject(a, "dynamic", args[i].dynamic);
        cJSON_AddNullToObject(a, "group_size");
        cJSON_AddNullToObject(a, "block_structure");
        cJSON_AddNullToObject(a, "actorder");
        if (args[i].observer)
            cJSON_AddStringToObject(a, "observer", args[i].observer);
        else
            cJSON_AddNullToObject(a, "observer");
        cJSON_AddObjectToObject(a, "observer_kwargs");
    }
    cJSON_AddNullToObject(g, "output_activations");
    cJSON_AddStringToObject(q, "format", "float-quantized");
    cJSON_AddItemToObject(q, "ignore", cJSON_CreateStringArray(ignore, 3));
    cJSON_AddNullToObject(q, "kv_cache_scheme");
    cJSON_AddNullToObject(q, "global_compression_ratio");
    cJSON_AddStringToObject(q, "quant_method", "compressed-tensors");
    cJSON_AddStringToObject(q, "quantization_status", "compressed");
}

/* preprocessor_config.json with the published values (engine/model/README.md §1). */
static cJSON *preprocessor_json(const preset *p)
{
    static const double mean[] = {0.48145466, 0.4578275, 0.40821073};
    static const double std[] = {0.26862954, 0.26130258, 0.27577711};
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "image_processor_type", "MllamaImageProcessor");
    cJSON *size = cJSON_AddObjectToObject(c, "size");
    cJSON_AddNumberToObject(size, "height", p->tile);
    cJSON_AddNumberToObject(size, "width", p->tile);
    cJSON_AddNumberToObject(c, "max_image_tiles", MAX_TILES);
    cJSON_AddNumberToObject(c, "resample", 2);
    cJSON_AddNumberToObject(c, "rescale_factor", 1.0 / 255.0);
    cJSON_AddItemToObject(c, "image_mean", cJSON_CreateDoubleArray(mean, 3));
    cJSON_AddItemToObject(c, "image_std", cJSON_CreateDoubleArray(std, 3));
    cJSON_AddBoolToObject(c, "do_convert_rgb", 1);
    cJSON_AddBoolToObject(c, "do_normalize", 1);
    cJSON_AddBoolToObject(c, "do_pad", 1);
    cJSON_AddBoolToObject(c, "do_rescale", 1);
    cJSON_AddBoolToObject(c, "do_resize", 1);
    return c;
}

/* ---- random values ------------------------------------------------------ */

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* FNV-1a: a stream per tensor name, so values do not depend on list order. */
static uint64_t name_hash(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* Scale of a tensor's values: activations keep unit scale through Linear
 * layers (std 1/sqrt(fan_in)), norms start at 1, gates are open enough for
 * every branch to matter. Uniform values of half-width sqrt(3)·std. */
static void fill(const ml_manifest_entry *e, uint16_t *out, size_t n, uint64_t seed)
{
    int64_t fan_in = 1;
    for (int d = 1; d < e->ndim; d++)
        fan_in *= e->shape[d];
    double center = 0, std;
    if (e->is_gate) {
        center = 0.6;
        std = 0.2;
    } else if (ends_with(e->name, ".bias")) {
        std = 0.02;
    } else if (e->ndim == 1 && strstr(e->name, "norm")) {
        center = 1.0;
        std = 0.05;
    } else if (strstr(e->name, "embed") && !strstr(e->name, "patch_embedding")) {
        std = e->ndim == 1 ? 0.5 : 0.1; /* class embedding, or a table */
    } else {
        std = 1.0 / sqrt((double)fan_in); /* a Linear, or the patch conv */
    }
    double half = sqrt(3.0) * std;
    uint64_t s = seed ^ name_hash(e->name);
    for (size_t i = 0; i < n; i++) {
        double u = (double)(splitmix64(&s) >> 11) * 0x1.0p-53; /* [0, 1) */
        out[i] = ml_f32_to_bf16((float)(center + (2 * u - 1) * half));
    }
}

/* ---- the writer ---------------------------------------------------------- */

/* Entry i holds a Linear's random bf16 values (rows, cols): replace them by
 * their F8_E4M3 codes and fill entry i + 1, its weight_scale, with the
 * scales (the manifest binds a scale right after its weight). */
static ml_status quantize_entry(const ml_manifest_entry *m, ml_tensor_view *views,
                                uint16_t **data, size_t i, size_t n, char *err, size_t errlen)
{
    const int64_t rows = m[i].shape[0], cols = m[i].shape[1];
    uint8_t *q = malloc((size_t)(rows * cols));
    uint16_t *s = malloc((size_t)rows * sizeof *s);
    if (i + 1 >= n || !q || !s) {
        free(q);
        free(s);
        return ml_fail(err, errlen, ML_ERR_NOMEM, "out of memory quantizing %s", m[i].name);
    }
    ml_fp8_quantize_rows(data[i], rows, cols, q, s);
    free(data[i]);
    data[i] = (uint16_t *)q; /* freed as the other buffers */
    views[i].dtype = ML_DTYPE_F8_E4M3;
    views[i].data = q;
    views[i].nbytes = (size_t)(rows * cols);
    ml_tensor_view *sv = &views[i + 1];
    *sv = (ml_tensor_view){.name = m[i + 1].name, .dtype = ML_DTYPE_BF16, .ndim = m[i + 1].ndim};
    memcpy(sv->shape, m[i + 1].shape, sizeof m[i + 1].shape);
    sv->data = s;
    sv->nbytes = (size_t)rows * sizeof *s;
    data[i + 1] = s;
    return ML_OK;
}

/* mkdir -p: every missing component of dir. */
static int make_dirs(const char *dir)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return -1;
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    return mkdir(path, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

/* Every manifest entry as a view without data: the writer leaves each a
 * hole, so the files get their full size but no blocks. */
static void header_views(const ml_manifest_entry *m, ml_tensor_view *views, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        ml_tensor_view *v = &views[i];
        *v = (ml_tensor_view){.name = m[i].name, .dtype = m[i].dtype, .ndim = m[i].ndim};
        memcpy(v->shape, m[i].shape, sizeof m[i].shape);
        v->nbytes = (size_t)ml_tensor_view_numel(v) * ml_dtype_size(v->dtype);
    }
}

/* Random values for every manifest entry into data[i] (owned by the
 * caller), FP8 Linears quantized with their scale in the next entry. */
static ml_status random_views(const ml_manifest_entry *m, ml_tensor_view *views, uint16_t **data,
                              size_t n, uint64_t seed, char *err, size_t errlen)
{
    ml_status rc = ML_OK;
    for (size_t i = 0; rc == ML_OK && i < n; i++) {
        ml_tensor_view *v = &views[i];
        *v = (ml_tensor_view){.name = m[i].name, .dtype = ML_DTYPE_BF16, .ndim = m[i].ndim};
        memcpy(v->shape, m[i].shape, sizeof m[i].shape);
        size_t numel = (size_t)ml_tensor_view_numel(v);
        v->nbytes = numel * sizeof(uint16_t);
        if (!(data[i] = malloc(v->nbytes)))
            return ml_fail(err, errlen, ML_ERR_NOMEM, "out of memory for %s", m[i].name);
        fill(&m[i], data[i], numel, seed);
        v->data = data[i];
        if (m[i].dtype == ML_DTYPE_F8_E4M3) /* the values, quantized; its scale comes next */
            rc = quantize_entry(m, views, data, i, n, err, errlen);
        i += m[i].dtype == ML_DTYPE_F8_E4M3;
    }
    return rc;
}

ml_status ml_mkmodel(const char *name, const char *dir, const char *tokenizer_dir, uint64_t seed,
                     unsigned flags, char *err, size_t errlen)
{
    const preset *p = NULL;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (!strcmp(presets[i].name, name))
            p = &presets[i];
    if (!p)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "unknown preset '%s' (micro, tiny, small, 1b, 11b, 90b)", name);
    const int header_only = (flags & ML_MKMODEL_HEADER_ONLY) != 0;
    if (p->header_only && !header_only)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "preset '%s' is header-only: its random weights would not fit in memory",
                       name);
    if (make_dirs(dir) != 0)
        return ml_fail(err, errlen, ML_ERR_IO, "%s: %s", dir, strerror(errno));

    char path[4096], from[4096];
    cJSON *cj = config_json(p), *pj = preprocessor_json(p);
    if (flags & ML_MKMODEL_FP8)
        add_fp8_config(cj);
    char *cfg_text = cJSON_Print(cj);
    static ml_config cfg; /* large: the ignore list */
    ml_status rc = cfg_text ? ML_OK : ml_fail(err, errlen, ML_ERR_NOMEM, "out of memory");
    if (rc == ML_OK)
        rc = ml_config_parse(&cfg, cfg_text, strlen(cfg_text), err, errlen);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (rc == ML_OK)
        rc = write_file(path, cfg_text, strlen(cfg_text), err, errlen);
    snprintf(path, sizeof path, "%s/preprocessor_config.json", dir);
    if (rc == ML_OK)
        rc = write_json(path, pj, err, errlen);
    static const char *const tok_files[] = {"tokenizer.json", "tokenizer_config.json"};
    for (size_t i = 0; rc == ML_OK && i < sizeof tok_files / sizeof tok_files[0]; i++) {
        snprintf(from, sizeof from, "%s/%s", tokenizer_dir, tok_files[i]);
        snprintf(path, sizeof path, "%s/%s", dir, tok_files[i]);
        rc = copy_file(from, path, err, errlen);
    }
    free(cfg_text);
    cJSON_Delete(cj);
    cJSON_Delete(pj);
    if (rc != ML_OK)
        return rc;

    ml_manifest_entry *m;
    size_t n;
    if ((rc = ml_weights_manifest(&cfg, &m, &n, err, errlen)) != ML_OK)
        return rc;
    ml_tensor_view *views = calloc(n, sizeof *views);
    uint16_t **data = calloc(n, sizeof *data);
    if (!views || !data)
        rc = ml_fail(err, errlen, ML_ERR_NOMEM, "out of memory");
    else if (header_only)
        header_views(m, views, n);
    else
        rc = random_views(m, views, data, n, seed, err, errlen);
    if (rc == ML_OK)
        rc = ml_safetensors_write_sharded(dir, views, n,
                                          header_only ? HUB_SHARD_BYTES : SHARD_BYTES, NULL, err,
                                          errlen);
    for (size_t i = 0; data && i < n; i++)
        free(data[i]);
    free(data);
    free(views);
    free(m);
    return rc;
}
