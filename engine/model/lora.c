/* LoRA adapters (lora.h): the adaptable Linears of a config ("sites"),
 * reading an adapter directory into host memory, adapter slots in backend
 * memory. The graph runs a slot's sites after their matmuls in linear.c. */
#include "model/lora.h"

#include <assert.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/mapped_file.h"
#include "checkpoint/safetensors.h"
#include "dtype.h"
#include "model/lora_internal.h"
#include "model/model_internal.h"
#include "model/shard.h"

/* Every PEFT adapter key starts with this (PeftModel.base_model.model). */
#define PEFT_PREFIX "base_model.model."
#define SUFFIX_A ".lora_A.weight"
#define SUFFIX_B ".lora_B.weight"
/* The frozen copy of a LoRA-wrapped lm_head that PEFT saves beside it
 * (save_embedding_layers). */
#define SUFFIX_BASE ".base_layer.weight"
#define NAME_LEN ML_MANIFEST_NAME_MAX
/* Messages quote tensor names up to this many bytes. */
#define QUOTE "%.200s"

/* ---- sites ------------------------------------------------------------- */

static int n_vision_layers(const ml_config *cfg)
{
    return cfg->vision.num_hidden_layers + cfg->vision.num_global_layers;
}

int ml_lora_site_vision(const ml_config *cfg, int global, int layer, ml_lora_vision_module mod)
{
    return ((global ? cfg->vision.num_hidden_layers : 0) + layer) * ML_LORA_VISION_MODULES +
           (int)mod;
}

int ml_lora_site_projector(const ml_config *cfg)
{
    return n_vision_layers(cfg) * ML_LORA_VISION_MODULES;
}

int ml_lora_site_lm_head(const ml_config *cfg)
{
    return ml_lora_site_projector(cfg) + 1;
}

int ml_lora_site_text(const ml_config *cfg, int layer, ml_lora_text_module mod)
{
    return ml_lora_site_lm_head(cfg) + 1 + layer * ML_LORA_TEXT_MODULES + (int)mod;
}

/* How many adaptable Linears (sites) cfg has: the first site past the last text layer. */
static int lora_n_sites(const ml_config *cfg)
{
    return ml_lora_site_text(cfg, cfg->text.num_hidden_layers, ML_LORA_TEXT_Q);
}

/* One adaptable Linear: its hub module name and nn.Linear sizes. */
typedef struct site_info {
    char name[NAME_LEN];
    int in, out;
    int image;            /* feeds an image's resident state */
    ml_shard_split split; /* how a shard keeps it */
} site_info;

static const char *const vision_paths[ML_LORA_VISION_MODULES] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
    "self_attn.o_proj", "mlp.fc1",          "mlp.fc2",
};
static const char *const text_leaves[ML_LORA_TEXT_MODULES] = {
    "q_proj", "k_proj", "v_proj", "o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
};

/* nn.Linear(in, out) of a text module (MllamaTextSelfSdpaAttention,
 * MllamaTextCrossSdpaAttention, MllamaTextMLP). */
static void text_sizes(const ml_text_config *tc, ml_lora_text_module mod, int *in, int *out)
{
    const int D = tc->hidden_size, Q = tc->num_attention_heads * tc->head_dim;
    const int KV = tc->num_key_value_heads * tc->head_dim, I = tc->intermediate_size;
    switch (mod) {
    case ML_LORA_TEXT_Q: *in = D, *out = Q; break;
    case ML_LORA_TEXT_K:
    case ML_LORA_TEXT_V: *in = D, *out = KV; break;
    case ML_LORA_TEXT_O: *in = Q, *out = D; break;
    case ML_LORA_TEXT_GATE:
    case ML_LORA_TEXT_UP: *in = D, *out = I; break;
    case ML_LORA_TEXT_DOWN:
    default: *in = I, *out = D; break;
    }
}

static void describe_site(const ml_config *cfg, int site, site_info *s)
{
    const ml_vision_config *vc = &cfg->vision;
    const ml_text_config *tc = &cfg->text;
    if (site < ml_lora_site_projector(cfg)) {
        int layer = site / ML_LORA_VISION_MODULES, mod = site % ML_LORA_VISION_MODULES;
        int global = layer >= vc->num_hidden_layers;
        snprintf(s->name, sizeof s->name, "vision_model.%s.layers.%d.%s",
                 global ? "global_transformer" : "transformer",
                 global ? layer - vc->num_hidden_layers : layer, vision_paths[mod]);
        s->in = mod == ML_LORA_VISION_FC2 ? vc->intermediate_size : vc->hidden_size;
        s->out = mod == ML_LORA_VISION_FC1 ? vc->intermediate_size : vc->hidden_size;
        s->image = 1;
        s->split = ml_shard_split_vision((ml_lora_vision_module)mod);
    } else if (site == ml_lora_site_projector(cfg)) {
        snprintf(s->name, sizeof s->name, "multi_modal_projector");
        s->in = vc->vision_output_dim;
        s->out = tc->hidden_size;
        s->image = 1;
        s->split = ML_SHARD_WHOLE;
    } else if (site == ml_lora_site_lm_head(cfg)) {
        snprintf(s->name, sizeof s->name, "language_model.lm_head");
        s->in = tc->hidden_size;
        s->out = tc->vocab_size;
        s->image = 0;
        s->split = ML_SHARD_WHOLE;
    } else {
        int rel = site - ml_lora_site_text(cfg, 0, ML_LORA_TEXT_Q);
        int layer = rel / ML_LORA_TEXT_MODULES;
        ml_lora_text_module mod = (ml_lora_text_module)(rel % ML_LORA_TEXT_MODULES);
        int cross = ml_config_cross_index(cfg, layer) >= 0;
        snprintf(s->name, sizeof s->name, "language_model.model.layers.%d.%s%s", layer,
                 mod <= ML_LORA_TEXT_O ? (cross ? "cross_attn." : "self_attn.") : "",
                 text_leaves[mod]);
        text_sizes(tc, mod, &s->in, &s->out);
        /* Cross k/v project the image's states once, at encode. */
        s->image = cross && (mod == ML_LORA_TEXT_K || mod == ML_LORA_TEXT_V);
        s->split = ml_shard_split_text(mod);
    }
}

/* The hub name of a site as transformers >= 4.52 spells it (the inverse of
 * ml_checkpoint_canonical_name), for matching target_modules of adapters
 * trained on that layout. */
static void new_layout_name(const char *hub, char *out, size_t n)
{
    static const struct {
        const char *hub, *now;
    } prefixes[] = {
        {"language_model.model.", "model.language_model."},
        {"vision_model.", "model.vision_model."},
        {"multi_modal_projector", "model.multi_modal_projector"},
        {"language_model.lm_head", "lm_head"},
    };
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
        size_t len = strlen(prefixes[i].hub);
        if (!strncmp(hub, prefixes[i].hub, len)) {
            snprintf(out, n, "%s%s", prefixes[i].now, hub + len);
            return;
        }
    }
    snprintf(out, n, "%s", hub);
}

/* ---- ml_lora_adapter --------------------------------------------------- */

typedef struct lora_module {
    int rank;              /* 0: not adapted */
    int in, out;
    const uint16_t *a, *b; /* into ml_lora_adapter.data: (rank, in), (out, rank) */
} lora_module;

struct ml_lora_adapter {
    int r;
    float scale;
    int n_sites, n_modules, touches_images;
    lora_module *mods; /* owned (n_sites) */
    uint16_t *data;    /* owned: every A and B, bf16 */
};

/* A site by name, for lookups. */
typedef struct site_ref {
    const char *name; /* borrowed from loader.sites */
    int id;
} site_ref;

/* Everything one load needs, freed together. */
typedef struct loader {
    const char *dir;
    const ml_config *cfg;
    ml_lora_config *config;      /* owned */
    ml_safetensors *st;          /* owned */
    int n_sites;
    site_info *sites;            /* owned (n_sites) */
    site_ref *by_name;           /* owned (n_sites): sorted by name */
    const ml_tensor_view **a, **b; /* owned (n_sites): the tensors found */
    int new_layout;              /* keys use transformers >= 4.52 names */
    char *err;
    size_t errlen;
} loader;

static int cmp_site_refs(const void *x, const void *y)
{
    return strcmp(((const site_ref *)x)->name, ((const site_ref *)y)->name);
}

/* The site named `name` (hub spelling), or -1. */
static int find_site(const loader *ld, const char *name)
{
    int lo = 0, hi = ld->n_sites;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(name, ld->by_name[mid].name);
        if (c == 0)
            return ld->by_name[mid].id;
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return -1;
}

static int ends_with(const char *s, size_t len, const char *suffix)
{
    size_t n = strlen(suffix);
    return len >= n && !memcmp(s + len - n, suffix, n);
}

static ml_status read_config(loader *ld)
{
    char path[PATH_MAX], why[256];
    if (snprintf(path, sizeof path, "%s/%s", ld->dir, ML_LORA_CONFIG_FILE) >= (int)sizeof path)
        return ml_fail(ld->err, ld->errlen, ML_ERR_INVALID_ARG, "%s: path too long", ld->dir);
    ml_mapped_file mf;
    ml_status rc = ml_mapped_file_init(&mf, path, ML_LORA_CONFIG_MAX_BYTES, why, sizeof why);
    if (rc == ML_OK)
        rc = ml_lora_config_parse(&ld->config, (const char *)mf.data, mf.size, why, sizeof why);
    ml_mapped_file_deinit(&mf);
    if (rc != ML_OK)
        return ml_fail(ld->err, ld->errlen, rc, "%s/%s: %s", ld->dir, ML_LORA_CONFIG_FILE, why);
    return ML_OK;
}

static ml_status open_weights(loader *ld)
{
    char path[PATH_MAX], why[512];
    if (snprintf(path, sizeof path, "%s/%s", ld->dir, ML_LORA_WEIGHTS_FILE) >= (int)sizeof path)
        return ml_fail(ld->err, ld->errlen, ML_ERR_INVALID_ARG, "%s: path too long", ld->dir);
    ml_status rc = ml_safetensors_open(&ld->st, path, why, sizeof why);
    if (rc == ML_ERR_NOT_FOUND)
        return ml_fail(ld->err, ld->errlen, rc, "%s: no %s (adapter_model.bin is not supported)",
                       ld->dir, ML_LORA_WEIGHTS_FILE);
    if (rc != ML_OK)
        return ml_fail(ld->err, ld->errlen, rc, "%s: %s", ld->dir, why);
    /* Keys of the newer layout start with "model." after the PEFT prefix. */
    for (size_t i = 0; i < ml_safetensors_count(ld->st); i++) {
        const char *name = ml_safetensors_tensor(ld->st, i)->name;
        if (!strncmp(name, PEFT_PREFIX "model.", strlen(PEFT_PREFIX "model.")))
            ld->new_layout = 1;
    }
    return ML_OK;
}

static ml_status build_sites(loader *ld)
{
    int n = ld->n_sites = lora_n_sites(ld->cfg);
    ld->sites = malloc((size_t)n * sizeof *ld->sites);
    ld->by_name = malloc((size_t)n * sizeof *ld->by_name);
    ld->a = calloc((size_t)n, sizeof *ld->a);
    ld->b = calloc((size_t)n, sizeof *ld->b);
    if (!ld->sites || !ld->by_name || !ld->a || !ld->b)
        return ml_fail(ld->err, ld->errlen, ML_ERR_NOMEM, "%s: out of memory", ld->dir);
    for (int i = 0; i < n; i++) {
        describe_site(ld->cfg, i, &ld->sites[i]);
        ld->by_name[i] = (site_ref){ld->sites[i].name, i};
    }
    qsort(ld->by_name, (size_t)n, sizeof *ld->by_name, cmp_site_refs);
    return ML_OK;
}

/* t must be a float tensor of shape (rows, cols). */
static ml_status check_shape(const loader *ld, const ml_tensor_view *t, int64_t rows,
                             int64_t cols)
{
    if (t->dtype != ML_DTYPE_BF16 && t->dtype != ML_DTYPE_F16 && t->dtype != ML_DTYPE_F32)
        return ml_fail(ld->err, ld->errlen, ML_ERR_FORMAT,
                       "%s: tensor " QUOTE " has dtype %s; LoRA weights must be BF16, F16 or F32",
                       ld->dir, t->name, ml_dtype_name(t->dtype));
    if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols) {
        char got[64] = "()";
        if (t->ndim == 1)
            snprintf(got, sizeof got, "(%lld)", (long long)t->shape[0]);
        else if (t->ndim >= 2)
            snprintf(got, sizeof got, "(%lld, %lld%s)", (long long)t->shape[0],
                     (long long)t->shape[1], t->ndim > 2 ? ", ..." : "");
        return ml_fail(ld->err, ld->errlen, ML_ERR_FORMAT,
                       "%s: tensor " QUOTE " has shape %s, expected (%lld, %lld)", ld->dir,
                       t->name, got, (long long)rows, (long long)cols);
    }
    return ML_OK;
}

/* What an adapter key holds, by its suffix. */
typedef enum key_kind {
    KEY_A,
    KEY_B,
    KEY_BASE,
} key_kind;

/* File one tensor of the adapter under its site. */
static ml_status classify_tensor(loader *ld, const ml_tensor_view *t)
{
    const size_t prefix = strlen(PEFT_PREFIX);
    if (strncmp(t->name, PEFT_PREFIX, prefix))
        return ml_fail(ld->err, ld->errlen, ML_ERR_FORMAT,
                       "%s: tensor " QUOTE " is not a PEFT adapter key (" PEFT_PREFIX
                       "<module>.lora_A.weight)",
                       ld->dir, t->name);
    char canon[2 * NAME_LEN];
    size_t len = ml_checkpoint_canonical_name(t->name + prefix, canon, sizeof canon);
    if (len >= sizeof canon)
        return ml_fail(ld->err, ld->errlen, ML_ERR_FORMAT, "%s: tensor name " QUOTE " too long",
                       ld->dir, t->name);
    static const char *const suffixes[] = {[KEY_A] = SUFFIX_A, [KEY_B] = SUFFIX_B,
                                           [KEY_BASE] = SUFFIX_BASE};
    key_kind kind = KEY_A;
    while (kind <= KEY_BASE && !ends_with(canon, len, suffixes[kind]))
        kind++;
    if (kind > KEY_BASE)
        return ml_fail(ld->err, ld->errlen, ML_ERR_UNSUPPORTED,
                       "%s: tensor " QUOTE " is not a LoRA A or B weight (DoRA, embedding "
                       "LoRA and modules_to_save are not supported)",
                       ld->dir, t->name);
    canon[len - strlen(suffixes[kind])] = '\0';
    int site = find_site(ld, canon);
    if (site < 0)
        return ml_fail(ld->err, ld->errlen, ML_ERR_UNSUPPORTED,
                       "%s: tensor " QUOTE ": module " QUOTE
                       " is not an adaptable Linear of this model",
                       ld->dir, t->name, canon);
    const site_info *s = &ld->sites[site];
    if (kind == KEY_BASE) {
        /* Only PEFT's frozen lm_head copy is expected; it must be the base
         * layer's shape, and is not used. */
        if (site != ml_lora_site_lm_head(ld->cfg))
            return ml_fail(ld->err, ld->errlen, ML_ERR_UNSUPPORTED,
                           "%s: tensor " QUOTE " replaces base weights: not supported", ld->dir,
                           t->name);
        return check_shape(ld, t, s->out, s->in);
    }
    const ml_tensor_view **slot = kind == KEY_A ? &ld->a[site] : &ld->b[site];
    if (*slot)
        return ml_fail(ld->err, ld->errlen, ML_ERR_FORMAT,
                       "%s: tensors " QUOTE " and " QUOTE " are the same weight", ld->dir,
                       (*slot)->name, t->name);
    *slot = t;
    int r = ml_lora_config_rank(ld->config);
    return kind == KEY_A ? check_shape(ld, t, r, s->in) : check_shape(ld, t, s->out, r);
}

/* Targeted modules have both tensors; tensors belong to targeted modules. */
static ml_status check_targets(loader *ld, int *n_modules)
{
    *n_modules = 0;
    for (int i = 0; i < ld->n_sites; i++) {
        char name[NAME_LEN];
        if (ld->new_layout)
            new_layout_name(ld->sites[i].name, name, sizeof name);
        else
            snprintf(name, sizeof name, "%s", ld->sites[i].name);
        int targeted = ml_lora_config_targets(ld->config, name);
        if (!targeted && (ld->a[i] || ld->b[i]))
            return ml_fail(ld->err, ld->errlen, ML_ERR_FORMAT,
                           "%s: tensor " QUOTE " adapts module %s, which target_modules does "
                           "not name",
                           ld->dir, (ld->a[i] ? ld->a[i] : ld->b[i])->name, name);
        if (targeted && (!ld->a[i] || !ld->b[i]))
            return ml_fail(ld->err, ld->errlen, ML_ERR_NOT_FOUND,
                           "%s: target_modules names %s but tensor " PEFT_PREFIX "%s%s is "
                           "missing",
                           ld->dir, name, name, ld->a[i] ? SUFFIX_B : SUFFIX_A);
        *n_modules += targeted;
    }
    if (*n_modules == 0)
        return ml_fail(ld->err, ld->errlen, ML_ERR_FORMAT,
                       "%s: target_modules names no Linear of this model", ld->dir);
    return ML_OK;
}

/* t (rows, cols) as bf16 into dst, through the f32 staging buffer tmp. */
static ml_status convert(loader *ld, const ml_tensor_view *t, uint16_t *dst, float *tmp)
{
    char why[256];
    if (ml_tensor_view_read_f32(t, tmp, why, sizeof why) != ML_OK)
        return ml_fail(ld->err, ld->errlen, ML_ERR_FORMAT, "%s: %s", ld->dir, why);
    ml_f32_to_bf16_n(dst, tmp, (size_t)ml_tensor_view_numel(t));
    return ML_OK;
}

/* The adapter's weights in bf16, one buffer. */
static ml_status materialize(loader *ld, ml_lora_adapter *ad)
{
    size_t total = 0, largest = 0;
    for (int i = 0; i < ld->n_sites; i++) {
        if (!ld->a[i])
            continue;
        size_t na = (size_t)ml_tensor_view_numel(ld->a[i]);
        size_t nb = (size_t)ml_tensor_view_numel(ld->b[i]);
        total += na + nb;
        largest = na > largest ? na : largest;
        largest = nb > largest ? nb : largest;
    }
    ad->data = malloc(total * sizeof *ad->data);
    float *tmp = malloc(largest * sizeof *tmp);
    ml_status rc = ad->data && tmp ? ML_OK
                                   : ml_fail(ld->err, ld->errlen, ML_ERR_NOMEM,
                                             "%s: out of memory for %zu LoRA weights", ld->dir,
                                             total);
    uint16_t *next = ad->data;
    for (int i = 0; i < ld->n_sites && rc == ML_OK; i++) {
        lora_module *md = &ad->mods[i];
        md->in = ld->sites[i].in;
        md->out = ld->sites[i].out;
        if (!ld->a[i])
            continue;
        md->rank = ad->r;
        md->a = next;
        if ((rc = convert(ld, ld->a[i], next, tmp)) != ML_OK)
            break;
        next += (size_t)ad->r * md->in;
        md->b = next;
        rc = convert(ld, ld->b[i], next, tmp);
        next += (size_t)md->out * ad->r;
        ad->touches_images |= ld->sites[i].image;
    }
    free(tmp);
    return rc;
}

static void loader_deinit(loader *ld)
{
    ml_lora_config_destroy(ld->config);
    ml_safetensors_destroy(ld->st);
    free(ld->sites);
    free(ld->by_name);
    free(ld->a);
    free(ld->b);
}

ml_status ml_lora_adapter_load(ml_lora_adapter **out, const char *dir, const ml_config *cfg,
                               char *err, size_t errlen)
{
    *out = NULL;
    loader ld = {.dir = dir, .cfg = cfg, .err = err, .errlen = errlen};
    ml_lora_adapter *ad = calloc(1, sizeof *ad);
    ml_status rc = ad ? ML_OK : ml_fail(err, errlen, ML_ERR_NOMEM, "%s: out of memory", dir);
    if (rc == ML_OK && (rc = read_config(&ld)) == ML_OK && (rc = open_weights(&ld)) == ML_OK)
        rc = build_sites(&ld);
    for (size_t i = 0; rc == ML_OK && i < ml_safetensors_count(ld.st); i++)
        rc = classify_tensor(&ld, ml_safetensors_tensor(ld.st, i));
    if (rc == ML_OK)
        rc = check_targets(&ld, &ad->n_modules);
    if (rc == ML_OK) {
        ad->r = ml_lora_config_rank(ld.config);
        ad->scale = ml_lora_config_scale(ld.config);
        ad->n_sites = ld.n_sites;
        ad->mods = calloc((size_t)ld.n_sites, sizeof *ad->mods);
        rc = ad->mods ? materialize(&ld, ad)
                      : ml_fail(err, errlen, ML_ERR_NOMEM, "%s: out of memory", dir);
    }
    loader_deinit(&ld);
    if (rc != ML_OK) {
        ml_lora_adapter_destroy(ad);
        return rc;
    }
    *out = ad;
    return ML_OK;
}

void ml_lora_adapter_destroy(ml_lora_adapter *a)
{
    if (!a)
        return;
    free(a->mods);
    free(a->data);
    free(a);
}

int ml_lora_adapter_rank(const ml_lora_adapter *a) { return a->r; }
float ml_lora_adapter_scale(const ml_lora_adapter *a) { return a->scale; }
int ml_lora_adapter_n_modules(const ml_lora_adapter *a) { return a->n_modules; }
int ml_lora_adapter_touches_images(const ml_lora_adapter *a) { return a->touches_images; }

/* ---- ml_lora: slots ---------------------------------------------------- */

/* The part of a site that a shard keeps: A's columns [in0, in0 + in) and
 * B's rows [out0, out0 + out) of the whole (out, in) Linear. Under tensor
 * parallelism a column-parallel Linear's output is this shard's range of
 * rows, so its LoRA adds B's rows of that range to x · Aᵀ; a row-parallel
 * Linear sees this shard's range of input columns and its partial output is
 * all-reduced after the lora op (text.c, vision.c), so the partial
 * (x_shard · A_shardᵀ) · Bᵀ of every shard sums to the whole delta. */
typedef struct site_part {
    int in0, in, out0, out;
} site_part;

static site_part part_of(const ml_shard_dims *sh, const site_info *s)
{
    site_part p = {0, s->in, 0, s->out};
    switch (s->split) {
    case ML_SHARD_OUT:
        p.out = s->out / sh->world;
        p.out0 = sh->rank * p.out;
        break;
    case ML_SHARD_IN:
        p.in = s->in / sh->world;
        p.in0 = sh->rank * p.in;
        break;
    case ML_SHARD_WHOLE: break;
    }
    return p;
}

/* bf16 elements of one site's A and B regions at max_rank. */
static size_t part_elems(const site_part *p, int max_rank)
{
    return ((size_t)p->in + (size_t)p->out) * (size_t)max_rank;
}

size_t ml_lora_shard_bytes(const ml_shard *s, int max_rank)
{
    size_t elems = 0;
    site_info si;
    for (int i = 0; i < lora_n_sites(&s->cfg); i++) {
        describe_site(&s->cfg, i, &si);
        site_part p = part_of(&s->dims, &si);
        elems += part_elems(&p, max_rank);
    }
    return elems * sizeof(uint16_t);
}

/* A slot or handle of model m with nothing allocated yet, or NULL; cfg is
 * the model's (any shard's). */
static ml_lora *slot_new(const ml_model *m, const ml_config *cfg, int max_rank)
{
    ml_lora *l = calloc(1, sizeof *l);
    if (l) {
        l->model = m;
        l->max_rank = max_rank;
        l->n_sites = lora_n_sites(cfg);
    }
    return l;
}

/* An empty slot of m on shard s's backend. */
static ml_status slot_create(ml_lora **out, const ml_model *m, ml_shard *s, int max_rank,
                             char *err, size_t errlen)
{
    *out = NULL;
    if (!s->be->ops->lora)
        return ml_fail(err, errlen, ML_ERR_UNSUPPORTED, "adapter slot: backend %s has no lora op",
                       s->be->ops->name);
    ml_lora *l = slot_new(m, &s->cfg, max_rank);
    if (!l)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "adapter slot: out of memory");
    l->shard = s;
    l->bytes = ml_lora_shard_bytes(s, max_rank);
    l->sites = calloc((size_t)l->n_sites, sizeof *l->sites);
    l->mem = s->be->ops->alloc(s->be, l->bytes);
    if (!l->sites || !l->mem) {
        double mib = (double)l->bytes / (1 << 20);
        ml_lora_destroy(l);
        return ml_fail(err, errlen, ML_ERR_NOMEM, "adapter slot: cannot allocate %.1f MiB", mib);
    }
    *out = l;
    return ML_OK;
}

/* bf16 elements of the host buffer that gathers a row-parallel A's column
 * range, for the shards of s's group (any rank: the ranges have one width). */
static size_t stage_elems(const ml_shard *s, int max_rank)
{
    size_t widest = 0;
    site_info si;
    for (int i = 0; i < lora_n_sites(&s->cfg); i++) {
        describe_site(&s->cfg, i, &si);
        site_part p = part_of(&s->dims, &si);
        if (p.in < si.in && (size_t)p.in > widest)
            widest = (size_t)p.in;
    }
    return widest * (size_t)max_rank;
}

/* The handle of tensor-parallel model m: a slot on every rank's shard. */
static ml_status split_slot_create(ml_lora **out, const ml_model *m, ml_shard *const *shards,
                                   int world, int max_rank, char *err, size_t errlen)
{
    ml_lora *l = slot_new(m, &shards[0]->cfg, max_rank);
    if (!l)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "adapter slot: out of memory");
    l->parts = calloc((size_t)world, sizeof *l->parts);
    /* +1: malloc(0) may be NULL. */
    l->stage = malloc((stage_elems(shards[0], max_rank) + 1) * sizeof *l->stage);
    if (!l->parts || !l->stage) {
        ml_lora_destroy(l);
        return ml_fail(err, errlen, ML_ERR_NOMEM, "adapter slot: out of memory");
    }
    l->n_parts = world;
    for (int r = 0; r < world; r++) {
        char why[256];
        ml_status st = slot_create(&l->parts[r], m, shards[r], max_rank, why, sizeof why);
        if (st != ML_OK) {
            ml_lora_destroy(l);
            return ml_fail(err, errlen, st, "%s (rank %d of %d)", why, r, world);
        }
    }
    l->bytes = l->parts[0]->bytes;
    *out = l;
    return ML_OK;
}

ml_status ml_lora_slot_create(ml_lora **out, const ml_model *m, ml_shard *const *shards,
                              int n_shards, int max_rank, char *err, size_t errlen)
{
    *out = NULL;
    const ml_shard *s = shards[0];
    if (max_rank < 1 || max_rank > s->limits.max_lora_rank)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "adapter slot: rank %d outside [1, %d] (model limits' max_lora_rank)",
                       max_rank, s->limits.max_lora_rank);
    if (n_shards > 1)
        return split_slot_create(out, m, shards, n_shards, max_rank, err, errlen);
    if (s->dims.world > 1)
        return ml_fail(err, errlen, ML_ERR_UNSUPPORTED,
                       "adapter slot: shard %d of %d driven by hand (create the slot on the "
                       "ml_model_load_tp model)",
                       s->dims.rank, s->dims.world);
    return slot_create(out, m, shards[0], max_rank, err, errlen);
}

void ml_lora_destroy(ml_lora *l)
{
    if (!l)
        return;
    for (int r = 0; l->parts && r < l->n_parts; r++)
        ml_lora_destroy(l->parts[r]);
    free(l->parts);
    free(l->stage);
    if (l->mem)
        l->shard->be->ops->free(l->shard->be, l->mem);
    free(l->sites);
    free(l);
}

/* The slot adapts nothing. */
static void lora_clear(ml_lora *l)
{
    if (l->sites)
        memset(l->sites, 0, (size_t)l->n_sites * sizeof *l->sites);
    for (int r = 0; l->parts && r < l->n_parts; r++)
        lora_clear(l->parts[r]);
    l->touches_images = 0;
    l->scale = 0;
}

/* Upload the share of adapter a (checked against the model) that slot l's
 * shard keeps; stage: host room of stage_elems when l is a part of a handle. */
static void slot_upload(ml_lora *l, const ml_lora_adapter *a, uint16_t *stage)
{
    const ml_config *cfg = &l->shard->cfg;
    ml_backend *be = l->shard->be;
    uint16_t *next = l->mem;
    site_info s;
    for (int i = 0; i < l->n_sites; i++) {
        describe_site(cfg, i, &s);
        site_part p = part_of(&l->shard->dims, &s);
        const lora_module *md = &a->mods[i];
        uint16_t *dst_a = next, *dst_b = next + (size_t)p.in * l->max_rank;
        next += part_elems(&p, l->max_rank);
        if (!md->rank)
            continue;
        /* A (rank, in): the column range [in0, in0 + in) of every row. */
        const uint16_t *src_a = md->a;
        if (p.in < s.in) {
            assert(stage);
            for (int j = 0; j < md->rank; j++)
                memcpy(stage + (size_t)j * p.in, md->a + (size_t)j * s.in + p.in0,
                       (size_t)p.in * sizeof *stage);
            src_a = stage;
        }
        be->ops->upload(be, dst_a, src_a, (size_t)md->rank * p.in * sizeof *dst_a);
        /* B (out, rank): the rows [out0, out0 + out), contiguous. */
        be->ops->upload(be, dst_b, md->b + (size_t)p.out0 * md->rank,
                        (size_t)p.out * md->rank * sizeof *dst_b);
        l->sites[i] = (ml_lora_site){dst_a, dst_b, md->rank};
    }
    l->scale = a->scale;
    l->touches_images = a->touches_images;
}

ml_status ml_lora_set(ml_lora *l, const ml_lora_adapter *a, char *err, size_t errlen)
{
    lora_clear(l);
    const ml_config *cfg = l->parts ? &l->parts[0]->shard->cfg : &l->shard->cfg;
    if (a->n_sites != l->n_sites)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "adapter slot: the adapter was loaded for another model (%d Linears, "
                       "this one has %d)",
                       a->n_sites, l->n_sites);
    if (a->r > l->max_rank)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "adapter slot: adapter rank %d exceeds the slot rank %d", a->r,
                       l->max_rank);
    site_info s;
    for (int i = 0; i < l->n_sites; i++) {
        describe_site(cfg, i, &s);
        if (a->mods[i].in != s.in || a->mods[i].out != s.out)
            return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                           "adapter slot: %s is (%d -> %d) in the adapter, (%d -> %d) here",
                           s.name, a->mods[i].in, a->mods[i].out, s.in, s.out);
    }
    if (l->parts) {
        for (int r = 0; r < l->n_parts; r++)
            slot_upload(l->parts[r], a, l->stage);
    } else {
        slot_upload(l, a, NULL);
    }
    l->scale = a->scale;
    l->touches_images = a->touches_images;
    return ML_OK;
}

int ml_lora_touches_images(const ml_lora *l) { return l->touches_images; }
