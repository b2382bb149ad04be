/* The workspace of a shard (README.md "Contributing", Memory): the buffers
 * every vision encode and decoder step slices, carved once at load from one
 * backend allocation, and the host staging of a step's metadata. Below both
 * the loader (model.c) and the layer code (vision.c, text.c): the same
 * carving sizes the workspace at load and lays it out. */
#include <stdlib.h>

#include "model/model_internal.h"

/* Alignment of every carved buffer: a cache line, and what vector loads and
 * CUDA coalescing like. */
#define ML_CARVE_ALIGN 64

void *ml_carve(ml_carver *c, size_t bytes)
{
    size_t at = (c->off + ML_CARVE_ALIGN - 1) & ~(size_t)(ML_CARVE_ALIGN - 1);
    c->off = at + bytes;
    return c->base ? c->base + at : NULL;
}

/* ---- vision ---- */

ml_vision_dims ml_vision_dims_of(const ml_shard *m)
{
    const ml_vision_config *vc = &m->cfg.vision;
    ml_vision_dims d;
    d.T = vc->max_num_tiles;
    d.P = ml_config_num_patches(&m->cfg);
    d.Pp = ml_config_num_patches_padded(&m->cfg);
    d.S = d.T * d.Pp;
    d.Dv = vc->hidden_size;
    d.Iv = m->dims.vision_intermediate;
    d.heads = m->dims.vision_heads;
    d.hd = vc->head_dim;
    d.Da = d.heads * d.hd;
    d.side = vc->image_size;
    d.patch = vc->patch_size;
    d.patch_len = vc->num_channels * vc->patch_size * vc->patch_size;
    d.n_inter = vc->n_intermediate_layers;
    d.vout = vc->vision_output_dim;
    d.D = m->cfg.text.hidden_size;
    d.kv_width = m->dims.n_kv_heads * m->cfg.text.head_dim;
    return d;
}

void ml_vision_plan(const ml_shard *m, ml_carver *c, ml_vision_bufs *b)
{
    ml_vision_dims d = ml_vision_dims_of(m);
    size_t f = sizeof(float), S = (size_t)d.S, tp = (size_t)d.T * (size_t)d.P;
    b->pixels = ml_carve(c, (size_t)d.T * (size_t)m->cfg.vision.num_channels * (size_t)d.side *
                                (size_t)d.side * f);
    b->patches = ml_carve(c, (size_t)d.T * (size_t)(d.P - 1) * (size_t)d.patch_len * f);
    b->h = ml_carve(c, S * (size_t)d.Dv * f);
    b->x = ml_carve(c, S * (size_t)d.Dv * f);
    b->vout = ml_carve(c, tp * (size_t)d.vout * f);
    b->valid = ml_carve(c, S);
    b->lora_t = ml_carve(c, S * (size_t)m->limits.max_lora_rank * f);
    /* The encoder temporaries are dead once the global transformer is done;
     * the projector output and the K/V staging reuse their space. */
    size_t encoder_start = c->off;
    b->q = ml_carve(c, S * (size_t)d.Da * f);
    b->k = ml_carve(c, S * (size_t)d.Da * f);
    b->v = ml_carve(c, S * (size_t)d.Da * f);
    b->attn = ml_carve(c, S * (size_t)d.Da * f);
    b->mlp = ml_carve(c, S * (size_t)d.Iv * f);
    size_t encoder_end = c->off;
    c->off = encoder_start;
    b->proj = ml_carve(c, tp * (size_t)d.D * f);
    b->kv_tmp = ml_carve(c, tp * (size_t)d.kv_width * f);
    if (c->off < encoder_end)
        c->off = encoder_end;
}

/* ---- text ---- */

void ml_text_plan(const ml_shard *m, ml_carver *c, ml_text_bufs *b)
{
    const ml_text_config *tc = &m->cfg.text;
    const ml_model_limits *l = &m->limits;
    size_t f = sizeof(float), n = (size_t)l->max_step_tokens, s = (size_t)l->max_step_seqs;
    size_t qw = (size_t)m->dims.n_heads * tc->head_dim;
    size_t kvw = (size_t)m->dims.n_kv_heads * tc->head_dim;
    b->h = ml_carve(c, n * tc->hidden_size * f);
    b->x = ml_carve(c, n * tc->hidden_size * f);
    b->q = ml_carve(c, n * qw * f);
    b->attn = ml_carve(c, n * qw * f);
    b->k = ml_carve(c, n * kvw * f);
    b->v = ml_carve(c, n * kvw * f);
    b->gate = ml_carve(c, n * (size_t)m->dims.intermediate * f);
    b->up = ml_carve(c, n * (size_t)m->dims.intermediate * f);
    b->logits = ml_carve(c, (size_t)l->max_logit_rows * tc->vocab_size * f);
    b->rows = ml_carve(c, (size_t)l->max_logit_rows * tc->hidden_size * f);
    size_t R = (size_t)l->max_logit_rows, pens = s * (size_t)tc->vocab_size;
    b->sample_rows = ml_carve(c, R * sizeof *b->sample_rows);
    b->pen_id = ml_carve(c, pens * sizeof *b->pen_id);
    b->pen_count = ml_carve(c, pens * sizeof *b->pen_count);
    b->bias = ml_carve(c, s * ML_SAMPLE_MAX_BIAS * sizeof *b->bias);
    b->sampled = ml_carve(c, R * sizeof *b->sampled);
    b->sample_mask = ml_carve(c, s * (((size_t)tc->vocab_size + 63) / 64) * sizeof(uint64_t));
    b->sample_scratch =
        ml_carve(c, m->be->ops->sample_scratch_bytes(m->be, (int)R, tc->vocab_size));
    b->row_attn = ml_carve(c, n * f);
    b->row_mlp = ml_carve(c, n * f);
    b->tokens = ml_carve(c, n * sizeof(int32_t));
    b->pos = ml_carve(c, n * sizeof(int32_t));
    b->slots = ml_carve(c, n * sizeof(int32_t));
    b->block_tables = ml_carve(c, s * (size_t)m->max_blocks_per_seq * sizeof(int32_t));
    b->seq_start = ml_carve(c, (s + 1) * sizeof(int32_t));
    b->pos0 = ml_carve(c, s * sizeof(int32_t));
    b->image_states = ml_carve(c, s * (size_t)l->max_seq_images * sizeof(void *));
    b->n_images = ml_carve(c, s * sizeof(int32_t));
    b->allowed = ml_carve(c, n * (size_t)l->max_seq_images * m->cfg.vision.max_num_tiles);
    size_t lora_rows = n > (size_t)l->max_logit_rows ? n : (size_t)l->max_logit_rows;
    b->lora_t = ml_carve(c, lora_rows * (size_t)l->max_lora_rank * f);
}

/* ---- the whole ---- */

ml_status ml_workspace_create(ml_shard *m, char *err, size_t errlen)
{
    ml_carver vision = {0}, text = {0};
    ml_vision_plan(m, &vision, &m->vb);
    ml_text_plan(m, &text, &m->tb);
    /* Vision encodes and decoder steps never overlap: one buffer serves both. */
    m->workspace_bytes = vision.off > text.off ? vision.off : text.off;
    m->workspace = m->be->ops->alloc(m->be, m->workspace_bytes);
    if (!m->workspace)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "model: cannot allocate a %.1f MiB workspace",
                       (double)m->workspace_bytes / (1 << 20));
    vision = (ml_carver){.base = m->workspace};
    text = (ml_carver){.base = m->workspace};
    ml_vision_plan(m, &vision, &m->vb);
    ml_text_plan(m, &text, &m->tb);

    /* Host staging for the per-step metadata: same carving, host memory. */
    const ml_model_limits *l = &m->limits;
    size_t n = (size_t)l->max_step_tokens, s = (size_t)l->max_step_seqs;
    size_t chunks = (size_t)l->max_seq_images * (size_t)m->cfg.vision.max_num_tiles;
    ml_carver hc = {0};
    for (int pass = 0; pass < 2; pass++) {
        ml_step_host *h = &m->host;
        h->row_attn = ml_carve(&hc, n * sizeof(float));
        h->row_mlp = ml_carve(&hc, n * sizeof(float));
        h->tokens = ml_carve(&hc, n * sizeof(int32_t));
        h->pos = ml_carve(&hc, n * sizeof(int32_t));
        h->slots = ml_carve(&hc, n * sizeof(int32_t));
        h->block_tables = ml_carve(&hc, s * (size_t)m->max_blocks_per_seq * sizeof(int32_t));
        h->seq_start = ml_carve(&hc, (s + 1) * sizeof(int32_t));
        h->pos0 = ml_carve(&hc, s * sizeof(int32_t));
        h->image_states = ml_carve(&hc, s * (size_t)l->max_seq_images * sizeof(void *));
        h->n_images = ml_carve(&hc, s * sizeof(int32_t));
        h->allowed = ml_carve(&hc, n * chunks);
        h->lora_groups = ml_carve(&hc, s * sizeof *h->lora_groups);
        h->lora_segs = ml_carve(&hc, s * sizeof *h->lora_segs);
        size_t rows = (size_t)l->max_logit_rows, pens = s * (size_t)m->cfg.text.vocab_size;
        h->sample_rows = ml_carve(&hc, rows * sizeof *h->sample_rows);
        h->pen_id = ml_carve(&hc, pens * sizeof *h->pen_id);
        h->pen_count = ml_carve(&hc, pens * sizeof *h->pen_count);
        h->bias = ml_carve(&hc, s * ML_SAMPLE_MAX_BIAS * sizeof *h->bias);
        h->sampled = ml_carve(&hc, rows * sizeof *h->sampled);
        if (pass == 0) {
            hc.base = malloc(hc.off);
            if (!hc.base)
                return ml_fail(err, errlen, ML_ERR_NOMEM, "model: out of memory (step staging)");
            hc.off = 0;
        }
    }
    return ML_OK;
}
