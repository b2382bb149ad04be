/* Loading a checkpoint directory into a shard bound to a backend (a whole
 * model is the shard of world 1), and the model limits it is loaded under.
 * The workspace every later step slices is workspace.c's. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/mapped_file.h"
#include "model/lora.h"
#include "model/model_internal.h"
#include "model/shard.h"

/* Default largest adapter rank: covers common fine-tunes (8 .. 64) for a
 * scratch of (tokens, 64) floats. */
#define ML_DEFAULT_MAX_LORA_RANK 64

ml_model_limits ml_model_limits_default(void)
{
    ml_model_limits l = {
        .max_step_tokens = 512,
        .max_step_seqs = 32,
        .max_logit_rows = 32,
        .max_seq_images = 8,
        .kv_block_size = 16,
        .max_lora_rank = ML_DEFAULT_MAX_LORA_RANK,
        .decode_graphs = 1,
        .row_mask = ML_ROW_MASK_REFERENCE,
    };
    return l;
}

static const char *const ROW_MASK_NAMES[] = {
    [ML_ROW_MASK_REFERENCE] = "reference",
    [ML_ROW_MASK_TRANSFORMERS] = "transformers",
};

const char *ml_row_mask_mode_name(ml_row_mask_mode mode)
{
    return (unsigned)mode < sizeof ROW_MASK_NAMES / sizeof ROW_MASK_NAMES[0] ? ROW_MASK_NAMES[mode] : "?";
}

int ml_row_mask_mode_parse(const char *s, ml_row_mask_mode *out)
{
    for (size_t i = 0; s && i < sizeof ROW_MASK_NAMES / sizeof ROW_MASK_NAMES[0]; i++) {
        if (strcmp(s, ROW_MASK_NAMES[i]) == 0) {
            *out = (ml_row_mask_mode)i;
            return 0;
        }
    }
    return -1;
}

/* ---- weights on the backend ------------------------------------------- */

/* A Linear's weight through linear_weight, host (rows, cols) of elem_size
 * bytes each: the backend's copy in the layout its matmul reads. The host
 * bytes are read by nothing after it (the host views are kept only to be
 * freed), so their pages go back: no second copy of the weights stays
 * resident (a CPU backend's packed copy, a device's upload). */
static const void *linear_to_backend(ml_shard *m, const void *host, const ml_weight *w,
                                     size_t elem_size)
{
    const void *view =
        m->be->ops->linear_weight(m->be, host, (int)w->rows, (int)w->cols, elem_size);
    if (view == host)
        m->linears_borrowed = 1;
    else if (view)
        ml_pages_release(host, (size_t)w->rows * (size_t)w->cols * elem_size);
    return view;
}

/* A Linear's weight goes through linear_weight (its FP8 scale stays a
 * plain weight); every other tensor through weight. */
static void to_backend(ml_shard *m, ml_weight *w, int linear)
{
    ml_backend *be = m->be;
    const size_t n = (size_t)w->rows * (size_t)w->cols;
    if (w->data)
        w->data = linear ? linear_to_backend(m, w->data, w, sizeof *w->data)
                         : be->ops->weight(be, w->data, n * sizeof *w->data);
    if (w->f8) {
        w->f8 = linear_to_backend(m, w->f8, w, sizeof *w->f8);
        w->scale = be->ops->weight(be, w->scale, (size_t)w->rows * sizeof *w->scale);
    }
}

/* Give back what to_backend got (a failed weight is NULL, a no-op). */
static void from_backend(ml_shard *m, ml_weight *w, int linear)
{
    ml_backend *be = m->be;
    if (linear)
        be->ops->linear_weight_free(be, w->data);
    else
        be->ops->weight_free(be, w->data);
    w->data = NULL;
    if (w->f8) {
        be->ops->linear_weight_free(be, w->f8);
        be->ops->weight_free(be, w->scale);
        w->f8 = NULL;
        w->scale = NULL;
    }
}

/* fn on every ml_weight of w, with whether it is a Linear's (matmul)
 * weight: one list for binding and giving back. */
static void each_weight(ml_shard *m, ml_weights *w, void (*fn)(ml_shard *, ml_weight *, int linear))
{
    ml_vision_weights *v = &w->vision;
    ml_weight *vs[] = {&v->class_embedding, &v->position_embedding,
                       &v->tile_position_embedding, &v->pre_tile_embedding,
                       &v->post_tile_embedding, &v->layernorm_pre_weight, &v->layernorm_pre_bias,
                       &v->layernorm_post_weight, &v->layernorm_post_bias,
                       &w->projector_bias, &w->text.embed_tokens, &w->text.norm};
    ml_weight *vs_linear[] = {&v->patch_embedding, &w->projector_weight, &w->text.lm_head};
    for (size_t i = 0; i < sizeof vs / sizeof vs[0]; i++)
        fn(m, vs[i], 0);
    for (size_t i = 0; i < sizeof vs_linear / sizeof vs_linear[0]; i++)
        fn(m, vs_linear[i], 1);
    for (int k = 0; k < v->n_layers + v->n_global_layers; k++) {
        ml_vision_layer *l = k < v->n_layers ? &v->layers[k] : &v->global_layers[k - v->n_layers];
        ml_weight *ws[] = {&l->fc1_bias, &l->fc2_bias,
                           &l->input_layernorm_weight, &l->input_layernorm_bias,
                           &l->post_attention_layernorm_weight,
                           &l->post_attention_layernorm_bias};
        ml_weight *ws_linear[] = {&l->q_proj, &l->k_proj, &l->v_proj, &l->o_proj,
                                  &l->fc1_weight, &l->fc2_weight};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
            fn(m, ws[i], 0);
        for (size_t i = 0; i < sizeof ws_linear / sizeof ws_linear[0]; i++)
            fn(m, ws_linear[i], 1);
    }
    for (int k = 0; k < w->text.n_layers; k++) {
        ml_text_layer *l = &w->text.layers[k];
        ml_weight *ws[] = {&l->cross.q_norm, &l->cross.k_norm, &l->input_layernorm,
                           &l->post_attention_layernorm};
        ml_weight *ws_linear[] = {&l->self.q_proj, &l->self.k_proj, &l->self.v_proj,
                                  &l->self.o_proj, &l->cross.q_proj, &l->cross.k_proj,
                                  &l->cross.v_proj, &l->cross.o_proj, &l->gate_proj,
                                  &l->up_proj, &l->down_proj};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
            fn(m, ws[i], 0);
        for (size_t i = 0; i < sizeof ws_linear / sizeof ws_linear[0]; i++)
            fn(m, ws_linear[i], 1);
    }
}

/* W8A8 and an FP8 lm_head need FP8 weights: an FP8 checkpoint or
 * model.weights = "fp8" (an FP8 lm_head on a bf16 decoder is a scheme no
 * checkpoint uses, and the goldens measure it on FP8 decoders). Dynamic
 * per-token quantization takes nothing from the checkpoint (no calibrated
 * activation scale), so it is allowed whatever the scheme says of
 * input_activations: a W8A16 checkpoint (input_activations null, as
 * quantize-at-load's scheme) runs as vLLM would run the FP8-dynamic one.
 * Sets m->quant_x and m->cfg.quant.lm_head_fp8. */
static ml_status check_fp8_options(ml_shard *m, char *err, size_t errlen)
{
    m->quant_x = 0;
    const char *what = m->limits.fp8_activations ? "fp8 activations need"
                       : m->limits.fp8_lm_head   ? "an fp8 lm_head needs"
                                                 : NULL;
    if (what && m->cfg.quant.scheme == ML_QUANT_NONE)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "model: %s FP8 weights (an FP8 checkpoint, or model.weights = \"fp8\")",
                       what);
    m->quant_x = m->limits.fp8_activations;
    m->cfg.quant.lm_head_fp8 = m->limits.fp8_lm_head;
    return ML_OK;
}

/* m->w = m->host_weights with every data pointer replaced by the backend's
 * view of it (the same pointer on the CPU, one upload on a device). */
static ml_status bind_backend_weights(ml_shard *m, char *err, size_t errlen)
{
    const ml_weights *hw = m->host_weights;
    ml_weights *w = &m->w;
    if ((hw->bytes_f8 || hw->bytes_quantized) && !m->be->ops->matmul_f8)
        return ml_fail(err, errlen, ML_ERR_UNSUPPORTED,
                       "model: FP8 weights need a backend with an FP8 matmul (%s has none)",
                       m->be->ops->name);
    *w = *hw;
    /* +1: a config may have no global layers, and malloc(0) may be NULL. */
    w->vision.layers = malloc((size_t)(hw->vision.n_layers + 1) * sizeof *w->vision.layers);
    w->vision.global_layers =
        malloc((size_t)(hw->vision.n_global_layers + 1) * sizeof *w->vision.global_layers);
    w->text.layers = malloc((size_t)(hw->text.n_layers + 1) * sizeof *w->text.layers);
    if (!w->vision.layers || !w->vision.global_layers || !w->text.layers)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "model: out of memory binding weights");
    memcpy(w->vision.layers, hw->vision.layers,
           (size_t)hw->vision.n_layers * sizeof *w->vision.layers);
    memcpy(w->vision.global_layers, hw->vision.global_layers,
           (size_t)hw->vision.n_global_layers * sizeof *w->vision.global_layers);
    memcpy(w->text.layers, hw->text.layers, (size_t)hw->text.n_layers * sizeof *w->text.layers);
    ml_status st = ml_shard_weights(m, err, errlen);
    if (st != ML_OK)
        return st;

    ml_backend *be = m->be;
    each_weight(m, w, to_backend);
    m->w_bound = 1;
    st = be->ops->synchronize(be, err, errlen);
    /* A backend that copied every Linear (linear_weight) is done with the
     * host slices of the row-parallel ones once the copies are complete:
     * for 90B over 8 GPUs they would keep a third of each shard's weights
     * in host memory for nothing. */
    if (st == ML_OK && !m->linears_borrowed) {
        free(m->dims.row_slices);
        m->dims.row_slices = NULL;
    }
    return st;
}

/* ---- load ---------------------------------------------------------------- */

static ml_status check_limits(const ml_model_limits *l, char *err, size_t errlen)
{
    if (l->max_step_tokens <= 0 || l->max_step_seqs <= 0 || l->max_seq_images < 0 ||
        l->max_seq_images > ML_MAX_SEQ_IMAGES ||
        l->max_logit_rows < l->max_step_seqs || l->max_step_seqs > l->max_step_tokens ||
        l->kv_block_size <= 0 || l->max_lora_rank < 0 || l->max_lora_rank > ML_LORA_MAX_RANK ||
        (l->decode_graphs != 0 && l->decode_graphs != 1))
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "model limits: need tokens >= seqs > 0, logit rows >= seqs, a "
                       "positive block size, a LoRA rank in [0, %d] and decode graphs 0 or 1 "
                       "(tokens %d, seqs %d, logit rows %d, images %d, block %d, LoRA rank %d, "
                       "graphs %d)",
                       ML_LORA_MAX_RANK, l->max_step_tokens, l->max_step_seqs,
                       l->max_logit_rows, l->max_seq_images, l->kv_block_size,
                       l->max_lora_rank, l->decode_graphs);
    if (l->row_mask != ML_ROW_MASK_REFERENCE && l->row_mask != ML_ROW_MASK_TRANSFORMERS)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "model limits: row mask mode %d unknown",
                       (int)l->row_mask);
    return ML_OK;
}

ml_status ml_shard_load(ml_shard **out, const char *dir, ml_backend *be,
                        const ml_model_limits *limits, int rank, int world, char *err,
                        size_t errlen)
{
    *out = NULL;
    ml_model_limits lim = limits ? *limits : ml_model_limits_default();
    ml_status st = check_limits(&lim, err, errlen);
    if (st != ML_OK)
        return st;
    ml_shard *m = calloc(1, sizeof *m);
    if (!m)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "model: out of memory");
    m->be = be;
    m->limits = lim;

    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/config.json", dir) >= (int)sizeof path) {
        st = ml_fail(err, errlen, ML_ERR_INVALID_ARG, "model: path too long: %s", dir);
        goto fail;
    }
    if ((st = ml_config_load(&m->cfg, path, err, errlen)) != ML_OK ||
        (st = ml_shard_init(m, rank, world, err, errlen)) != ML_OK ||
        (st = ml_checkpoint_open(&m->ckpt, dir, err, errlen)) != ML_OK)
        goto fail;
    if (lim.quantize_fp8 && m->cfg.quant.scheme == ML_QUANT_NONE)
        ml_quant_config_fp8_at_load(&m->cfg.quant);
    if ((st = check_fp8_options(m, err, errlen)) != ML_OK)
        goto fail;
    if ((st = ml_weights_create(&m->host_weights, m->ckpt, &m->cfg, err, errlen)) != ML_OK ||
        (st = bind_backend_weights(m, err, errlen)) != ML_OK)
        goto fail;

    const ml_text_config *tc = &m->cfg.text;
    m->self_index = malloc((size_t)tc->num_hidden_layers * sizeof *m->self_index);
    if (!m->self_index) {
        st = ml_fail(err, errlen, ML_ERR_NOMEM, "model: out of memory");
        goto fail;
    }
    for (int i = 0; i < tc->num_hidden_layers; i++)
        m->self_index[i] = ml_config_cross_index(&m->cfg, i) < 0 ? m->n_self_layers++ : -1;

    /* Block tables are sized for the longest context the config allows. */
    m->max_blocks_per_seq =
        (tc->max_position_embeddings + lim.kv_block_size - 1) / lim.kv_block_size;

    float inv_freq[ML_MAX_HEAD_DIM / 2];
    if (tc->head_dim > ML_MAX_HEAD_DIM) {
        st = ml_fail(err, errlen, ML_ERR_UNSUPPORTED, "model: head_dim %d above %d",
                     tc->head_dim, ML_MAX_HEAD_DIM);
        goto fail;
    }
    ml_config_rope_inv_freq(&m->cfg, inv_freq);
    m->inv_freq = be->ops->alloc(be, sizeof(float) * (size_t)tc->head_dim / 2);
    if (!m->inv_freq) {
        st = ml_fail(err, errlen, ML_ERR_NOMEM, "model: out of memory");
        goto fail;
    }
    be->ops->upload(be, m->inv_freq, inv_freq, sizeof(float) * (size_t)tc->head_dim / 2);

    if ((st = ml_workspace_create(m, err, errlen)) != ML_OK)
        goto fail;
    *out = m;
    return ML_OK;
fail:
    ml_shard_destroy(m);
    return st;
}

void ml_shard_destroy(ml_shard *m)
{
    if (!m)
        return;
    if (m->workspace)
        m->be->ops->free(m->be, m->workspace);
    if (m->inv_freq)
        m->be->ops->free(m->be, m->inv_freq);
    free(m->host.row_attn); /* the start of the host staging allocation */
    free(m->self_index);
    if (m->w_bound)
        each_weight(m, &m->w, from_backend);
    free(m->w.vision.layers);
    free(m->w.vision.global_layers);
    free(m->w.text.layers);
    free(m->dims.row_slices);
    ml_weights_destroy(m->host_weights);
    ml_checkpoint_destroy(m->ckpt);
    free(m);
}
