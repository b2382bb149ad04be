/* Tensor parallelism as a property of the graph (engine/model/README.md §11): which
 * slice of every weight a shard keeps, and the all-reduce after each
 * row-parallel Linear. The split is Megatron-LM's for Llama, as in
 * vLLM's ColumnParallelLinear / RowParallelLinear: heads, K/V heads and
 * MLP channels are divided evenly between the shards. */
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"
#include "model/shard.h"

ml_status ml_shard_check_config(const ml_config *cfg, int world, char *err, size_t errlen)
{
    const ml_text_config *tc = &cfg->text;
    const ml_vision_config *vc = &cfg->vision;
    if (world < 1)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "shard: world %d", world);
    const struct {
        const char *name;
        int value;
    } split[] = {
        {"text_config.num_attention_heads", tc->num_attention_heads},
        {"text_config.num_key_value_heads", tc->num_key_value_heads},
        {"text_config.intermediate_size", tc->intermediate_size},
        {"vision_config.attention_heads", vc->attention_heads},
        {"vision_config.intermediate_size", vc->intermediate_size},
    };
    for (size_t i = 0; i < sizeof split / sizeof split[0]; i++)
        if (split[i].value % world != 0)
            return ml_fail(err, errlen, ML_ERR_UNSUPPORTED,
                           "shard: %s = %d does not divide into %d shards", split[i].name,
                           split[i].value, world);
    return ML_OK;
}

ml_status ml_shard_init(ml_shard *m, int rank, int world, char *err, size_t errlen)
{
    const ml_text_config *tc = &m->cfg.text;
    const ml_vision_config *vc = &m->cfg.vision;
    if (world < 1 || rank < 0 || rank >= world)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "shard: rank %d of world %d", rank,
                       world);
    ml_status st = ml_shard_check_config(&m->cfg, world, err, errlen);
    if (st != ML_OK)
        return st;
    if (world > 1 && !m->be->ops->all_reduce_sum)
        return ml_fail(err, errlen, ML_ERR_UNSUPPORTED,
                       "shard: backend %s has no all_reduce_sum (create it in a group)",
                       m->be->ops->name);
    m->dims.rank = rank;
    m->dims.world = world;
    m->dims.n_heads = tc->num_attention_heads / world;
    m->dims.n_kv_heads = tc->num_key_value_heads / world;
    m->dims.intermediate = tc->intermediate_size / world;
    m->dims.vision_heads = vc->attention_heads / world;
    m->dims.vision_intermediate = vc->intermediate_size / world;
    return ML_OK;
}

void ml_shard_all_reduce(ml_shard *m, float *x, size_t n)
{
    if (m->dims.world > 1)
        m->be->ops->all_reduce_sum(m->be, x, n);
}

ml_shard_split ml_shard_split_vision(ml_lora_vision_module mod)
{
    switch (mod) {
    case ML_LORA_VISION_Q:
    case ML_LORA_VISION_K:
    case ML_LORA_VISION_V:
    case ML_LORA_VISION_FC1: return ML_SHARD_OUT;
    case ML_LORA_VISION_O:
    case ML_LORA_VISION_FC2: return ML_SHARD_IN;
    case ML_LORA_VISION_MODULES: break;
    }
    return ML_SHARD_WHOLE;
}

ml_shard_split ml_shard_split_text(ml_lora_text_module mod)
{
    switch (mod) {
    case ML_LORA_TEXT_Q:
    case ML_LORA_TEXT_K:
    case ML_LORA_TEXT_V:
    case ML_LORA_TEXT_GATE:
    case ML_LORA_TEXT_UP: return ML_SHARD_OUT;
    case ML_LORA_TEXT_O:
    case ML_LORA_TEXT_DOWN: return ML_SHARD_IN;
    case ML_LORA_TEXT_MODULES: break;
    }
    return ML_SHARD_WHOLE;
}

/* ---- slicing ------------------------------------------------------------------ */

/* Two passes over the same code, as ml_carver: with base == NULL only the
 * row-parallel copies are counted (in elements) and nothing is changed;
 * with base set every weight is sliced. */
typedef struct slicer {
    const ml_shard_dims *shard;
    uint16_t *base;
    size_t used;
} slicer;

/* Column-parallel: the shard's range of output rows of w (out, in) and of
 * an FP8 weight's scales, or of the elements of a bias (1, out). A view, no
 * copy. */
static void take_out(slicer *sl, ml_weight *w)
{
    if (!sl->base || !(w->data || w->f8))
        return;
    int64_t world = sl->shard->world, rank = sl->shard->rank;
    if (w->f8) {
        w->rows /= world;
        w->f8 += rank * w->rows * w->cols;
        w->scale += rank * w->rows;
    } else if (w->rows == 1) {
        w->cols /= world;
        w->data += rank * w->cols;
    } else {
        w->rows /= world;
        w->data += rank * w->rows * w->cols;
    }
}

/* Row-parallel: the shard's range of input columns of w (out, in), copied
 * into the row_slices buffer since a column range is strided. An FP8
 * weight's bytes take whole bf16 elements of the buffer; its scales, one
 * per output row, are all the shard's. */
static void take_in(slicer *sl, ml_weight *w)
{
    if (!w->data && !w->f8)
        return;
    int64_t world = sl->shard->world, rank = sl->shard->rank;
    int64_t cols = w->cols / world;
    if (w->f8) {
        if (sl->base) {
            uint8_t *dst = (uint8_t *)(sl->base + sl->used);
            for (int64_t r = 0; r < w->rows; r++)
                memcpy(dst + r * cols, w->f8 + r * w->cols + rank * cols, (size_t)cols);
            w->f8 = dst;
            w->cols = cols;
        }
        sl->used += (size_t)(w->rows * cols + 1) / sizeof *sl->base;
        return;
    }
    if (sl->base) {
        uint16_t *dst = sl->base + sl->used;
        for (int64_t r = 0; r < w->rows; r++)
            memcpy(dst + r * cols, w->data + r * w->cols + rank * cols,
                   (size_t)cols * sizeof *dst);
        w->data = dst;
        w->cols = cols;
    }
    sl->used += (size_t)(w->rows * cols);
}

/* w as `split` says. */
static void take(slicer *sl, ml_weight *w, ml_shard_split split)
{
    switch (split) {
    case ML_SHARD_OUT: take_out(sl, w); break;
    case ML_SHARD_IN: take_in(sl, w); break;
    case ML_SHARD_WHOLE: break;
    }
}

static void slice_vision_layer(slicer *sl, ml_vision_layer *l)
{
    ml_weight *linear[ML_LORA_VISION_MODULES] = {
        [ML_LORA_VISION_Q] = &l->q_proj,       [ML_LORA_VISION_K] = &l->k_proj,
        [ML_LORA_VISION_V] = &l->v_proj,       [ML_LORA_VISION_O] = &l->o_proj,
        [ML_LORA_VISION_FC1] = &l->fc1_weight, [ML_LORA_VISION_FC2] = &l->fc2_weight,
    };
    for (int i = 0; i < ML_LORA_VISION_MODULES; i++)
        take(sl, linear[i], ml_shard_split_vision((ml_lora_vision_module)i));
    take_out(sl, &l->fc1_bias);
    /* The bias is part of the reduced sum once, not once per shard. */
    if (sl->base && sl->shard->rank != 0)
        l->fc2_bias.data = NULL;
}

static void slice_text_layer(slicer *sl, ml_text_layer *l)
{
    /* Self- and cross-attention projections split alike; a layer holds
     * one of the two (the other's views are empty). */
    ml_weight *linear[ML_LORA_TEXT_MODULES][2] = {
        [ML_LORA_TEXT_Q] = {&l->self.q_proj, &l->cross.q_proj},
        [ML_LORA_TEXT_K] = {&l->self.k_proj, &l->cross.k_proj},
        [ML_LORA_TEXT_V] = {&l->self.v_proj, &l->cross.v_proj},
        [ML_LORA_TEXT_O] = {&l->self.o_proj, &l->cross.o_proj},
        [ML_LORA_TEXT_GATE] = {&l->gate_proj, NULL},
        [ML_LORA_TEXT_UP] = {&l->up_proj, NULL},
        [ML_LORA_TEXT_DOWN] = {&l->down_proj, NULL},
    };
    for (int i = 0; i < ML_LORA_TEXT_MODULES; i++)
        for (int k = 0; k < 2 && linear[i][k]; k++)
            take(sl, linear[i][k], ml_shard_split_text((ml_lora_text_module)i));
}

static void slice_all(slicer *sl, ml_weights *w)
{
    for (int i = 0; i < w->vision.n_layers; i++)
        slice_vision_layer(sl, &w->vision.layers[i]);
    for (int i = 0; i < w->vision.n_global_layers; i++)
        slice_vision_layer(sl, &w->vision.global_layers[i]);
    for (int i = 0; i < w->text.n_layers; i++)
        slice_text_layer(sl, &w->text.layers[i]);
}

ml_status ml_shard_weights(ml_shard *m, char *err, size_t errlen)
{
    if (m->dims.world == 1)
        return ML_OK;
    slicer sl = {.shard = &m->dims};
    slice_all(&sl, &m->w);
    m->dims.row_slices = malloc(sl.used * sizeof *m->dims.row_slices);
    if (!m->dims.row_slices)
        return ml_fail(err, errlen, ML_ERR_NOMEM,
                       "shard: out of memory for %.1f MiB of row-parallel weights",
                       (double)(sl.used * sizeof *m->dims.row_slices) / (1 << 20));
    sl = (slicer){.shard = &m->dims, .base = m->dims.row_slices};
    slice_all(&sl, &m->w);
    return ML_OK;
}
