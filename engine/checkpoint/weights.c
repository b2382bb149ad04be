/* Binding the Mllama tensor set of engine/model/README.md §6 to a checkpoint.
 *
 * Two passes: bind() looks every tensor up by its hub name and checks its
 * shape against the config, recording (destination, source); materialize()
 * then points each destination at the mapping, or converts it into one
 * owned bf16 buffer. */
#include "checkpoint/weights.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/fp8_quant.h"
#include "dtype.h"

#define NAME_MAX_LEN ML_MANIFEST_NAME_MAX
/* Upper bound of bind() calls: per vision layer 12 tensors + 2 gates + 6
 * FP8 scales, per text layer at most 13 (cross) + 7 scales, plus the
 * model-level tensors. */
#define BINDS_PER_VISION_LAYER 20
#define BINDS_PER_TEXT_LAYER 20
#define BINDS_TOP_LEVEL 26
/* compressed-tensors names a quantized Linear's scale after its weight. */
#define WEIGHT_SUFFIX ".weight"
#define SCALE_SUFFIX "_scale"
#define BYTES_PER_MIB (1024.0 * 1024.0)

/* The graph-side handle plus what it owns; `pub` first so the public
 * pointer converts back. */
typedef struct weights_impl {
    ml_weights pub;
    uint16_t *converted; /* owned: every converted tensor, back to back */
    float *scales;       /* owned: every FP8 weight's scales, back to back */
    uint8_t *quantized;  /* owned: the FP8 weights quantized at load, back to back */
} weights_impl;

/* An expected shape; 4 dims at most (the patch conv). */
typedef struct shape {
    int ndim;
    int64_t d[4];
} shape;
#define SHAPE1(a) ((shape){1, {(a)}})
#define SHAPE2(a, b) ((shape){2, {(a), (b)}})
#define SHAPE4(a, b, c, d) ((shape){4, {(a), (b), (c), (d)}})

/* What a binding fills. */
typedef enum bind_kind {
    BIND_WEIGHT, /* dst->data: bf16 as stored or converted */
    BIND_GATE,   /* *gate */
    BIND_F8,     /* dst->f8: an FP8 Linear's weight, in place */
    BIND_SCALE,  /* dst->scale: its weight_scale, as f32 */
    BIND_QUANTIZE, /* dst->f8 and dst->scale: a float weight quantized here */
} bind_kind;

/* One recorded binding: gate for BIND_GATE, dst otherwise. */
typedef struct binding {
    bind_kind kind;
    ml_weight *dst;
    float *gate;
    const ml_tensor_view *src;
} binding;

typedef struct binder {
    const ml_checkpoint *ck; /* NULL: record the manifest instead of binding */
    const ml_quant_config *quant; /* borrowed: the config's */
    ml_manifest_entry *manifest; /* record mode: owned by the caller (cap entries) */
    binding *items; /* owned (cap) */
    size_t n, cap;
    char *err;
    size_t errlen;
} binder;

/* ---- pass 1: look up and check ----------------------------------------- */

static void format_shape(char *buf, size_t n, int ndim, const int64_t *d)
{
    size_t len = (size_t)snprintf(buf, n, "(");
    for (int i = 0; i < ndim && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%lld", i ? ", " : "", (long long)d[i]);
    if (len < n)
        snprintf(buf + len, n - len, ")");
}

static int is_float(ml_dtype t)
{
    return t == ML_DTYPE_BF16 || t == ML_DTYPE_F16 || t == ML_DTYPE_F32;
}

/* Look up the tensor `name`, check its shape and dtype (F8_E4M3 for
 * BIND_F8, a float type of 2 or 4 bytes otherwise), record it. */
static ml_status bind_name(binder *b, bind_kind kind, ml_weight *dst, float *gate, shape want,
                           const char *name)
{
    if (!b->ck) {
        assert(b->n < b->cap);
        ml_manifest_entry *e = &b->manifest[b->n++];
        snprintf(e->name, sizeof e->name, "%s", name);
        e->ndim = want.ndim;
        memcpy(e->shape, want.d, sizeof want.d);
        e->is_gate = kind == BIND_GATE;
        e->dtype = kind == BIND_F8 ? ML_DTYPE_F8_E4M3 : ML_DTYPE_BF16;
        e->quantized_at_load = kind == BIND_QUANTIZE;
        return ML_OK;
    }
    const ml_tensor_view *t = ml_checkpoint_find(b->ck, name);
    if (!t)
        return ml_fail(b->err, b->errlen, ML_ERR_NOT_FOUND, "checkpoint has no tensor '%s'", name);
    /* A scale may be stored (rows, 1), as compressed-tensors writes it, or (rows). */
    if (kind == BIND_SCALE && t->ndim == 1)
        want.ndim = 1;
    int same = t->ndim == want.ndim;
    for (int i = 0; i < want.ndim && same; i++)
        same = t->shape[i] == want.d[i];
    if (!same) {
        char got_s[128], want_s[128];
        format_shape(got_s, sizeof got_s, t->ndim, t->shape);
        format_shape(want_s, sizeof want_s, want.ndim, want.d);
        return ml_fail(b->err, b->errlen, ML_ERR_FORMAT, "tensor %s: shape %s, expected %s", name,
                       got_s, want_s);
    }
    if (kind == BIND_F8 && t->dtype != ML_DTYPE_F8_E4M3)
        return ml_fail(b->err, b->errlen, ML_ERR_FORMAT,
                       "tensor %s has dtype %s; quantization_config makes it F8_E4M3 (add its "
                       "module to `ignore` to keep it)",
                       name, ml_dtype_name(t->dtype));
    /* decompression computes in the scale's dtype (compressed-tensors'
     * dequantize), which the engine reproduces for bf16, the dtype of the
     * scales of a bf16 model (the published checkpoints). */
    if (kind == BIND_SCALE && t->dtype != ML_DTYPE_BF16)
        return ml_fail(b->err, b->errlen, ML_ERR_UNSUPPORTED,
                       "tensor %s has dtype %s; FP8 weight scales must be BF16", name,
                       ml_dtype_name(t->dtype));
    if (kind != BIND_F8 && !is_float(t->dtype))
        return ml_fail(b->err, b->errlen, ML_ERR_FORMAT,
                       "tensor %s has dtype %s; weights must be BF16, F16 or F32%s", name,
                       ml_dtype_name(t->dtype),
                       t->dtype == ML_DTYPE_F8_E4M3
                           ? " (F8_E4M3 needs a compressed-tensors quantization_config)"
                           : "");
    assert(b->n < b->cap);
    b->items[b->n++] = (binding){kind, dst, gate, t};
    return ML_OK;
}

static ml_status bind_any(binder *b, ml_weight *dst, float *gate, shape want, const char *fmt,
                          va_list ap)
{
    char name[NAME_MAX_LEN];
    vsnprintf(name, sizeof name, fmt, ap);
    return bind_name(b, gate ? BIND_GATE : BIND_WEIGHT, dst, gate, want, name);
}

static ml_status bind(binder *b, ml_weight *dst, shape s, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static ml_status bind(binder *b, ml_weight *dst, shape s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ml_status rc = bind_any(b, dst, NULL, s, fmt, ap);
    va_end(ap);
    return rc;
}

/* The weight `name` of an nn.Linear (out, in): as bind() without
 * quantization or when the ignore list names the module (matched on the
 * name the checkpoint stores, which may be either key layout; the hub name
 * in manifest mode), else an F8_E4M3 weight and its (out, 1) weight_scale.
 * force_fp8: a module the ignore list names is quantized here instead. */
static ml_status bind_linear_name(binder *b, ml_weight *dst, shape s, const char *name,
                                  int force_fp8)
{
    if (b->quant->scheme == ML_QUANT_NONE)
        return bind_name(b, BIND_WEIGHT, dst, NULL, s, name);
    const ml_tensor_view *t = b->ck ? ml_checkpoint_find(b->ck, name) : NULL;
    char module[NAME_MAX_LEN];
    snprintf(module, sizeof module, "%s", t ? t->name : name);
    const size_t len = strlen(module), suffix = strlen(WEIGHT_SUFFIX);
    assert(len > suffix && !strcmp(module + len - suffix, WEIGHT_SUFFIX));
    module[len - suffix] = '\0';
    int ignored;
    ml_status rc = ml_quant_config_ignores(b->quant, module, &ignored, b->err, b->errlen);
    if (rc != ML_OK)
        return rc;
    if (ignored && !force_fp8)
        return bind_name(b, BIND_WEIGHT, dst, NULL, s, name);
    if (ignored || b->quant->at_load)
        return bind_name(b, BIND_QUANTIZE, dst, NULL, s, name);
    char scale[NAME_MAX_LEN + sizeof SCALE_SUFFIX];
    snprintf(scale, sizeof scale, "%s" SCALE_SUFFIX, name);
    if ((rc = bind_name(b, BIND_F8, dst, NULL, s, name)) ||
        (rc = bind_name(b, BIND_SCALE, dst, NULL, SHAPE2(s.d[0], 1), scale)))
        return rc;
    return ML_OK;
}

/* bind_linear_name with the name formatted, as the ignore list says. */
static ml_status bind_linear(binder *b, ml_weight *dst, shape s, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static ml_status bind_linear(binder *b, ml_weight *dst, shape s, const char *fmt, ...)
{
    char name[NAME_MAX_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return bind_linear_name(b, dst, s, name, 0);
}

/* A gate: a shape-(1) tensor read into a float. */
static ml_status bind_gate(binder *b, float *gate, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ml_status bind_gate(binder *b, float *gate, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ml_status rc = bind_any(b, NULL, gate, SHAPE1(1), fmt, ap);
    va_end(ap);
    return rc;
}

static ml_status bind_vision_layer(binder *b, ml_vision_layer *l, const ml_vision_config *v,
                                   const char *stack, int i, int gated)
{
    const int64_t D = v->hidden_size, I = v->intermediate_size;
    char p[NAME_MAX_LEN / 2]; /* "vision_model.transformer.layers.7." */
    snprintf(p, sizeof p, "vision_model.%s.layers.%d.", stack, i);
    ml_status rc;
    if ((rc = bind_linear(b, &l->q_proj, SHAPE2(D, D), "%sself_attn.q_proj.weight", p)) ||
        (rc = bind_linear(b, &l->k_proj, SHAPE2(D, D), "%sself_attn.k_proj.weight", p)) ||
        (rc = bind_linear(b, &l->v_proj, SHAPE2(D, D), "%sself_attn.v_proj.weight", p)) ||
        (rc = bind_linear(b, &l->o_proj, SHAPE2(D, D), "%sself_attn.o_proj.weight", p)) ||
        (rc = bind_linear(b, &l->fc1_weight, SHAPE2(I, D), "%smlp.fc1.weight", p)) ||
        (rc = bind(b, &l->fc1_bias, SHAPE1(I), "%smlp.fc1.bias", p)) ||
        (rc = bind_linear(b, &l->fc2_weight, SHAPE2(D, I), "%smlp.fc2.weight", p)) ||
        (rc = bind(b, &l->fc2_bias, SHAPE1(D), "%smlp.fc2.bias", p)) ||
        (rc = bind(b, &l->input_layernorm_weight, SHAPE1(D), "%sinput_layernorm.weight", p)) ||
        (rc = bind(b, &l->input_layernorm_bias, SHAPE1(D), "%sinput_layernorm.bias", p)) ||
        (rc = bind(b, &l->post_attention_layernorm_weight, SHAPE1(D),
                   "%spost_attention_layernorm.weight", p)) ||
        (rc = bind(b, &l->post_attention_layernorm_bias, SHAPE1(D),
                   "%spost_attention_layernorm.bias", p)))
        return rc;
    l->is_gated = gated;
    if (gated && ((rc = bind_gate(b, &l->gate_attn, "%sgate_attn", p)) ||
                  (rc = bind_gate(b, &l->gate_ffn, "%sgate_ffn", p))))
        return rc;
    return ML_OK;
}

/* MllamaVisionModel (engine/model/README.md §3, §6). */
static ml_status bind_vision(binder *b, ml_vision_weights *w, const ml_config *cfg)
{
    const ml_vision_config *v = &cfg->vision;
    const int64_t D = v->hidden_size, P = ml_config_num_patches(cfg), T = v->max_num_tiles;
    const int64_t A = ml_config_n_aspect_ratio_ids(cfg), C = v->num_channels, k = v->patch_size;
    ml_status rc;
    if ((rc = bind(b, &w->patch_embedding, SHAPE4(D, C, k, k),
                   "vision_model.patch_embedding.weight")) ||
        (rc = bind(b, &w->class_embedding, SHAPE1(D), "vision_model.class_embedding")) ||
        (rc = bind(b, &w->position_embedding, SHAPE2(P, D),
                   "vision_model.gated_positional_embedding.embedding")) ||
        (rc = bind_gate(b, &w->position_gate, "vision_model.gated_positional_embedding.gate")) ||
        (rc = bind(b, &w->tile_position_embedding, SHAPE2(A, T * P * D),
                   "vision_model.gated_positional_embedding.tile_embedding.weight")) ||
        (rc = bind(b, &w->pre_tile_embedding, SHAPE2(A, T * D),
                   "vision_model.pre_tile_positional_embedding.embedding.weight")) ||
        (rc = bind_gate(b, &w->pre_tile_gate, "vision_model.pre_tile_positional_embedding.gate")) ||
        (rc = bind(b, &w->post_tile_embedding, SHAPE2(A, T * D),
                   "vision_model.post_tile_positional_embedding.embedding.weight")) ||
        (rc = bind_gate(b, &w->post_tile_gate,
                        "vision_model.post_tile_positional_embedding.gate")) ||
        (rc = bind(b, &w->layernorm_pre_weight, SHAPE1(D), "vision_model.layernorm_pre.weight")) ||
        (rc = bind(b, &w->layernorm_pre_bias, SHAPE1(D), "vision_model.layernorm_pre.bias")) ||
        (rc =
             bind(b, &w->layernorm_post_weight, SHAPE1(D), "vision_model.layernorm_post.weight")) ||
        (rc = bind(b, &w->layernorm_post_bias, SHAPE1(D), "vision_model.layernorm_post.bias")))
        return rc;
    for (int i = 0; i < w->n_layers; i++)
        if ((rc = bind_vision_layer(b, &w->layers[i], v, "transformer", i, 0)))
            return rc;
    for (int i = 0; i < w->n_global_layers; i++)
        if ((rc = bind_vision_layer(b, &w->global_layers[i], v, "global_transformer", i, 1)))
            return rc;
    return ML_OK;
}

/* One decoder layer: MllamaSelfAttentionDecoderLayer or
 * MllamaCrossAttentionDecoderLayer, as the config places it. */
static ml_status bind_text_layer(binder *b, ml_text_layer *l, const ml_text_config *t, int i,
                                 int is_cross)
{
    const int64_t D = t->hidden_size, I = t->intermediate_size;
    const int64_t Q = (int64_t)t->num_attention_heads * t->head_dim;
    const int64_t KV = (int64_t)t->num_key_value_heads * t->head_dim;
    char p[NAME_MAX_LEN / 2]; /* "language_model.model.layers.3." */
    snprintf(p, sizeof p, "language_model.model.layers.%d.", i);
    ml_status rc;
    if ((rc = bind(b, &l->input_layernorm, SHAPE1(D), "%sinput_layernorm.weight", p)) ||
        (rc = bind(b, &l->post_attention_layernorm, SHAPE1(D), "%spost_attention_layernorm.weight",
                   p)) ||
        (rc = bind_linear(b, &l->gate_proj, SHAPE2(I, D), "%smlp.gate_proj.weight", p)) ||
        (rc = bind_linear(b, &l->up_proj, SHAPE2(I, D), "%smlp.up_proj.weight", p)) ||
        (rc = bind_linear(b, &l->down_proj, SHAPE2(D, I), "%smlp.down_proj.weight", p)))
        return rc;
    l->is_cross = is_cross;
    if (!is_cross) {
        ml_text_self_attn *a = &l->self;
        if ((rc = bind_linear(b, &a->q_proj, SHAPE2(Q, D), "%sself_attn.q_proj.weight", p)) ||
            (rc = bind_linear(b, &a->k_proj, SHAPE2(KV, D), "%sself_attn.k_proj.weight", p)) ||
            (rc = bind_linear(b, &a->v_proj, SHAPE2(KV, D), "%sself_attn.v_proj.weight", p)) ||
            (rc = bind_linear(b, &a->o_proj, SHAPE2(D, Q), "%sself_attn.o_proj.weight", p)))
            return rc;
        return ML_OK;
    }
    ml_text_cross_attn *a = &l->cross;
    if ((rc = bind_linear(b, &a->q_proj, SHAPE2(Q, D), "%scross_attn.q_proj.weight", p)) ||
        (rc = bind_linear(b, &a->k_proj, SHAPE2(KV, D), "%scross_attn.k_proj.weight", p)) ||
        (rc = bind_linear(b, &a->v_proj, SHAPE2(KV, D), "%scross_attn.v_proj.weight", p)) ||
        (rc = bind_linear(b, &a->o_proj, SHAPE2(D, Q), "%scross_attn.o_proj.weight", p)) ||
        (rc = bind(b, &a->q_norm, SHAPE1(t->head_dim), "%scross_attn.q_norm.weight", p)) ||
        (rc = bind(b, &a->k_norm, SHAPE1(t->head_dim), "%scross_attn.k_norm.weight", p)) ||
        (rc = bind_gate(b, &a->attn_gate, "%scross_attn_attn_gate", p)) ||
        (rc = bind_gate(b, &a->mlp_gate, "%scross_attn_mlp_gate", p)))
        return rc;
    return ML_OK;
}

/* MllamaForCausalLM (engine/model/README.md §4, §6). */
static ml_status bind_text(binder *b, ml_text_weights *w, const ml_config *cfg)
{
    const ml_text_config *t = &cfg->text;
    /* MllamaTextModel: nn.Embedding(vocab_size + 8, hidden_size). */
    const int64_t rows = (int64_t)t->vocab_size + 8, D = t->hidden_size;
    ml_status rc;
    if ((rc = bind(b, &w->embed_tokens, SHAPE2(rows, D),
                   "language_model.model.embed_tokens.weight")) ||
        (rc = bind(b, &w->norm, SHAPE1(D), "language_model.model.norm.weight")) ||
        (rc = bind_linear_name(b, &w->lm_head, SHAPE2(t->vocab_size, D),
                               "language_model.lm_head.weight", cfg->quant.lm_head_fp8)))
        return rc;
    for (int i = 0; i < w->n_layers; i++)
        if ((rc = bind_text_layer(b, &w->layers[i], t, i, ml_config_cross_index(cfg, i) >= 0)))
            return rc;
    return ML_OK;
}

/* ---- pass 2: borrow or convert ----------------------------------------- */

static int needs_copy(const ml_tensor_view *t)
{
    return t->dtype != ML_DTYPE_BF16 || ((uintptr_t)t->data % sizeof(uint16_t)) != 0;
}

/* t (BF16/F16/F32, any alignment) as bf16 into out (numel elements). */
static void convert_to_bf16(const ml_tensor_view *t, uint16_t *out)
{
    const unsigned char *p = t->data;
    size_t n = (size_t)ml_tensor_view_numel(t);
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        float f;
        switch (t->dtype) {
        case ML_DTYPE_BF16: memcpy(&out[i], p + 2 * i, sizeof out[i]); break;
        case ML_DTYPE_F16:
            memcpy(&h, p + 2 * i, sizeof h);
            out[i] = ml_f32_to_bf16(ml_f16_to_f32(h));
            break;
        case ML_DTYPE_F32:
            memcpy(&f, p + 4 * i, sizeof f);
            out[i] = ml_f32_to_bf16(f);
            break;
        case ML_DTYPE_I32:
        case ML_DTYPE_I64:
        case ML_DTYPE_U8:
        case ML_DTYPE_F8_E4M3: assert(!"bind() admits float weights of 2 or 4 bytes only"); break;
        }
    }
}

/* Quantize the float weight t (rows, cols) into q and scale (f32), with tmp
 * (numel + rows bf16) for its bf16 values when not borrowable in place and
 * for its bf16 scales. */
static void quantize(const ml_tensor_view *t, uint8_t *q, float *scale, uint16_t *tmp)
{
    const int64_t rows = t->shape[0], cols = t->shape[1];
    const uint16_t *w = t->data;
    uint16_t *s16 = tmp + rows * cols;
    if (needs_copy(t)) {
        convert_to_bf16(t, tmp);
        w = tmp;
    }
    ml_fp8_quantize_rows(w, rows, cols, q, s16);
    for (int64_t r = 0; r < rows; r++)
        scale[r] = ml_bf16_to_f32(s16[r]);
}

static ml_status materialize(weights_impl *wi, const binder *b, char *err, size_t errlen)
{
    ml_weights *w = &wi->pub;
    size_t conv = 0, n_scales = 0, n_quantized = 0, max_quantized = 0;
    for (size_t i = 0; i < b->n; i++) {
        const binding *it = &b->items[i];
        const size_t numel = (size_t)ml_tensor_view_numel(it->src);
        switch (it->kind) {
        case BIND_WEIGHT: conv += needs_copy(it->src) ? numel : 0; break;
        case BIND_SCALE: n_scales += numel; break;
        case BIND_QUANTIZE:
            n_quantized += numel;
            n_scales += (size_t)it->src->shape[0];
            if (numel + (size_t)it->src->shape[0] > max_quantized)
                max_quantized = numel + (size_t)it->src->shape[0];
            break;
        case BIND_GATE:
        case BIND_F8: break;
        }
    }
    uint16_t *tmp = max_quantized ? malloc(max_quantized * sizeof *tmp) : NULL;
    wi->converted = conv ? malloc(conv * sizeof *wi->converted) : NULL;
    wi->scales = n_scales ? malloc(n_scales * sizeof *wi->scales) : NULL;
    wi->quantized = n_quantized ? malloc(n_quantized) : NULL;
    if ((max_quantized && !tmp) || (conv && !wi->converted) || (n_scales && !wi->scales) ||
        (n_quantized && !wi->quantized)) {
        free(tmp);
        return ml_fail(err, errlen, ML_ERR_NOMEM,
                       "out of memory converting %zu weights to bf16 and quantizing %zu", conv,
                       n_quantized);
    }
    uint16_t *next = wi->converted;
    float *next_scale = wi->scales;
    uint8_t *next_q = wi->quantized;
    ml_status rc = ML_OK;
    for (size_t i = 0; i < b->n && rc == ML_OK; i++) {
        const binding *it = &b->items[i];
        const ml_tensor_view *t = it->src;
        const int64_t numel = ml_tensor_view_numel(t);
        float v;
        switch (it->kind) {
        case BIND_GATE:
            if ((rc = ml_tensor_view_read_f32(t, &v, err, errlen)) == ML_OK)
                *it->gate = ml_round_bf16(v);
            continue;
        case BIND_SCALE:
            if ((rc = ml_tensor_view_read_f32(t, next_scale, err, errlen)) != ML_OK)
                continue;
            it->dst->scale = next_scale;
            next_scale += numel;
            w->bytes_scales += (size_t)numel * sizeof *next_scale;
            continue;
        case BIND_F8:
            it->dst->rows = t->shape[0];
            it->dst->cols = t->shape[1];
            it->dst->f8 = t->data;
            w->bytes_f8 += t->nbytes;
            continue;
        case BIND_QUANTIZE:
            it->dst->rows = t->shape[0];
            it->dst->cols = t->shape[1];
            quantize(t, next_q, next_scale, tmp);
            it->dst->f8 = next_q;
            it->dst->scale = next_scale;
            next_q += numel;
            next_scale += t->shape[0];
            w->bytes_quantized += (size_t)numel;
            w->bytes_scales += (size_t)t->shape[0] * sizeof *next_scale;
            continue;
        case BIND_WEIGHT: break;
        }
        it->dst->rows = t->ndim >= 2 ? t->shape[0] : 1;
        it->dst->cols = numel / it->dst->rows;
        if (needs_copy(t)) {
            convert_to_bf16(t, next);
            it->dst->data = next;
            next += numel;
            w->bytes_converted += (size_t)numel * sizeof *next;
        } else {
            it->dst->data = t->data;
            w->bytes_borrowed += t->nbytes;
        }
    }
    free(tmp);
    return rc;
}

/* ---- public ------------------------------------------------------------ */

/* Every tensor of the model, in one order for binding and for the manifest. */
static ml_status bind_all(binder *b, ml_weights *w, const ml_config *cfg)
{
    const int64_t D = cfg->text.hidden_size;
    ml_status rc;
    if ((rc = bind_vision(b, &w->vision, cfg)) ||
        (rc = bind_linear(b, &w->projector_weight, SHAPE2(D, cfg->vision.vision_output_dim),
                   "multi_modal_projector.weight")) ||
        (rc = bind(b, &w->projector_bias, SHAPE1(D), "multi_modal_projector.bias")) ||
        (rc = bind_text(b, &w->text, cfg)))
        return rc;
    return ML_OK;
}

/* Upper bound of the tensors of cfg. */
static size_t tensor_cap(const ml_config *cfg)
{
    return (size_t)(cfg->vision.num_hidden_layers + cfg->vision.num_global_layers) *
               BINDS_PER_VISION_LAYER +
           (size_t)cfg->text.num_hidden_layers * BINDS_PER_TEXT_LAYER + BINDS_TOP_LEVEL;
}

/* A weights handle with its layer arrays for cfg (one allocation), or NULL. */
static weights_impl *weights_alloc(const ml_config *cfg)
{
    const int nv = cfg->vision.num_hidden_layers, ng = cfg->vision.num_global_layers;
    const int nt = cfg->text.num_hidden_layers;
    weights_impl *wi = calloc(1, sizeof *wi + (size_t)(nv + ng) * sizeof(ml_vision_layer) +
                                     (size_t)nt * sizeof(ml_text_layer));
    if (!wi)
        return NULL;
    ml_weights *w = &wi->pub;
    w->vision.n_layers = nv;
    w->vision.layers = (ml_vision_layer *)(wi + 1);
    w->vision.n_global_layers = ng;
    w->vision.global_layers = w->vision.layers + nv;
    w->text.n_layers = nt;
    w->text.layers = (ml_text_layer *)(w->vision.global_layers + ng);
    return wi;
}

ml_status ml_weights_manifest(const ml_config *cfg, ml_manifest_entry **out, size_t *n,
                              char *err, size_t errlen)
{
    *out = NULL;
    *n = 0;
    size_t cap = tensor_cap(cfg);
    weights_impl *wi = weights_alloc(cfg);
    binder b = {.quant = &cfg->quant, .manifest = malloc(cap * sizeof(ml_manifest_entry)),
                .cap = cap, .err = err, .errlen = errlen};
    if (!wi || !b.manifest) {
        free(wi);
        free(b.manifest);
        return ml_fail(err, errlen, ML_ERR_NOMEM, "out of memory for the tensor manifest");
    }
    ml_status rc = bind_all(&b, &wi->pub, cfg);
    free(wi);
    if (rc != ML_OK) {
        free(b.manifest);
        return rc;
    }
    *out = b.manifest;
    *n = b.n;
    return ML_OK;
}

ml_status ml_weights_create(ml_weights **out, const ml_checkpoint *ck, const ml_config *cfg,
                            char *err, size_t errlen)
{
    *out = NULL;
    size_t cap = tensor_cap(cfg);
    weights_impl *wi = weights_alloc(cfg);
    binder b = {.ck = ck, .quant = &cfg->quant, .items = malloc(cap * sizeof(binding)),
                .cap = cap, .err = err, .errlen = errlen};
    if (!wi || !b.items) {
        free(wi);
        free(b.items);
        return ml_fail(err, errlen, ML_ERR_NOMEM, "out of memory for the weight tables");
    }
    ml_weights *w = &wi->pub;
    ml_status rc = bind_all(&b, w, cfg);
    if (rc == ML_OK)
        rc = materialize(wi, &b, err, errlen);
    w->n_bound = b.n;
    w->n_unused = ml_checkpoint_count(ck) - b.n;
    free(b.items);
    if (rc != ML_OK) {
        ml_weights_destroy(w);
        return rc;
    }
    *out = w;
    return ML_OK;
}

void ml_weights_destroy(ml_weights *w)
{
    if (!w)
        return;
    weights_impl *wi = (weights_impl *)w;
    free(wi->converted);
    free(wi->scales);
    free(wi->quantized);
    free(wi);
}

const char *ml_weights_summary(const ml_weights *w, char *buf, size_t n)
{
    snprintf(buf, n,
             "%zu tensors bound (bf16: %.1f MiB in place, %.1f MiB converted; fp8: %.1f MiB in "
             "place, %.1f MiB quantized at load, %.1f MiB scales), %zu unused",
             w->n_bound, (double)w->bytes_borrowed / BYTES_PER_MIB,
             (double)w->bytes_converted / BYTES_PER_MIB, (double)w->bytes_f8 / BYTES_PER_MIB,
             (double)w->bytes_quantized / BYTES_PER_MIB, (double)w->bytes_scales / BYTES_PER_MIB,
             w->n_unused);
    return buf;
}
