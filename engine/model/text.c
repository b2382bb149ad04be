/* The text decoder over a batch of sequences (transformers v4.47
 * MllamaTextModel.forward with MllamaSelfAttentionDecoderLayer and
 * MllamaCrossAttentionDecoderLayer, then lm_head; engine/model/README.md §4, §5, §8).
 *
 * Shapes: N = tokens in the step (all sequences), D = hidden, H = heads,
 * KV = key/value heads, hd = head_dim, I = MLP width, all per shard under
 * tensor parallelism (shard.h ml_shard_dims: H/N heads, KV/N kv heads,
 * I/N channels; o_proj and down_proj outputs are partial sums, all-reduced).
 * Sequences are contiguous row ranges of every (N, ...) buffer.
 *
 * LoRA: runs of consecutive sequences with the same adapter form the step's
 * groups; every adaptable Linear is an ml_linear (linear.h), its matmul
 * followed by one segmented lora op over all groups (the rows of base-model
 * sequences are untouched). */
#include <math.h>
#include <string.h>

#include "model/linear.h"
#include "model/lora_internal.h"
#include "model/model_internal.h"
#include "model/shard.h"

/* ---- step metadata -------------------------------------------------------- */

/* Logit rows one sequence occupies in b->logits. */
static int logit_rows(const ml_step_seq *q)
{
    return q->logits == ML_LOGITS_ALL ? q->n_tokens : q->logits != ML_LOGITS_NONE;
}

static int wants_rows(const ml_step_seq *q)
{
    return q->logits == ML_LOGITS_LAST || q->logits == ML_LOGITS_ALL;
}

/* Controls of a logit row nobody samples: the cheapest the op runs (one
 * maximum); its result is not read. */
static const ml_sample_row unsampled_row = {.temperature = 0.0f, .top_p = 1.0f,
                                            .repetition_penalty = 1.0f};

/* Stage the sample op's controls of logit row r, which belongs to sequence
 * q (index s), and q's penalty and bias entries when it is sampled. */
static ml_status stage_sample_row(ml_shard *m, const ml_step_seq *q, int s, int r, char *err,
                                  size_t errlen)
{
    ml_step_host *h = &m->host;
    int vocab = m->cfg.text.vocab_size;
    if (q->logits != ML_LOGITS_SAMPLE) {
        h->sample_rows[r] = unsampled_row;
        return ML_OK;
    }
    if (!q->sample || !q->sampled || q->sample->n_pen < 0 ||
        (q->sample->n_pen > 0 && (!q->pen_id || !q->pen_count)) || q->sample->n_bias < 0 ||
        (q->sample->n_bias > 0 && !q->bias))
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "step: sequence %d is sampled without its controls, entries or output", s);
    /* Each sampled sequence lists distinct ids, so at most vocab of them:
     * the staging holds max_step_seqs lists of that size. */
    int n_pen = q->sample->n_pen;
    if (n_pen > vocab)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "step: sequence %d lists %d penalty ids for a vocabulary of %d", s, n_pen,
                       vocab);
    for (int i = 0; i < n_pen; i++)
        if (q->pen_id[i] < 0 || q->pen_id[i] >= vocab)
            return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                           "step: sequence %d penalty id %d outside [0, %d)", s, q->pen_id[i],
                           vocab);
    /* The staging holds max_step_seqs lists of ML_SAMPLE_MAX_BIAS. */
    int n_bias = q->sample->n_bias;
    if (n_bias > ML_SAMPLE_MAX_BIAS)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "step: sequence %d lists %d bias entries, at most %d", s, n_bias,
                       ML_SAMPLE_MAX_BIAS);
    for (int i = 0; i < n_bias; i++)
        if (q->bias[i].id < 0 || q->bias[i].id >= vocab)
            return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                           "step: sequence %d bias id %d outside [0, %d)", s, q->bias[i].id,
                           vocab);
    if (n_pen > 0) { /* the arrays may be NULL then */
        memcpy(h->pen_id + h->n_pen, q->pen_id, (size_t)n_pen * sizeof *h->pen_id);
        memcpy(h->pen_count + h->n_pen, q->pen_count, (size_t)n_pen * sizeof *h->pen_count);
    }
    if (n_bias > 0)
        memcpy(h->bias + h->n_bias, q->bias, (size_t)n_bias * sizeof *h->bias);
    h->sample_rows[r] = *q->sample;
    h->sample_rows[r].pen_start = h->n_pen;
    h->sample_rows[r].bias_start = h->n_bias;
    h->sample_rows[r].mask = q->mask ? (uint32_t)++h->n_mask : 0;
    h->n_pen += n_pen;
    h->n_bias += n_bias;
    return ML_OK;
}

/* Check the step against the load limits and fill the host staging.
 * Returns the number of tokens and logit rows through *n_tokens, *n_rows. */
static ml_status stage_step(ml_shard *m, const ml_kv_cache *kv, const ml_step_seq *seqs,
                            int n_seqs, int *n_tokens, int *n_rows, char *err, size_t errlen)
{
    const ml_model_limits *l = &m->limits;
    const ml_text_config *tc = &m->cfg.text;
    ml_step_host *h = &m->host;
    int T = m->cfg.vision.max_num_tiles, B = l->kv_block_size;
    size_t stride = (size_t)l->max_seq_images * T; /* allowed's row: every image's tiles */
    int embed_rows = tc->vocab_size + ML_MODEL_EMBED_EXTRA_ROWS;
    if (n_seqs <= 0 || n_seqs > l->max_step_seqs)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "step: %d sequences, limit %d", n_seqs,
                       l->max_step_seqs);
    if (ml_kv_cache_block_size(kv) != B)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "step: kv cache blocks of %d tokens, model limits say %d",
                       ml_kv_cache_block_size(kv), B);
    int n = 0, rows = 0;
    ml_status st;
    h->n_lora_groups = 0;
    h->n_pen = 0;
    h->n_bias = 0;
    h->n_mask = 0;
    for (int s = 0; s < n_seqs; s++) {
        const ml_step_seq *q = &seqs[s];
        int end = q->pos0 + q->n_tokens;
        if (q->lora && q->lora->shard != m)
            return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                           "step: sequence %d has an adapter slot of another model", s);
        if (q->logits < ML_LOGITS_NONE || q->logits > ML_LOGITS_SAMPLE)
            return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "step: sequence %d asks logits mode %d",
                           s, q->logits);
        int n_logits = logit_rows(q);
        if (q->lora && s > 0 && seqs[s - 1].lora == q->lora) {
            ml_lora_group *g = &h->lora_groups[h->n_lora_groups - 1];
            g->n_rows += q->n_tokens;
            g->n_logits += n_logits;
        } else if (q->lora) {
            h->lora_groups[h->n_lora_groups++] = (ml_lora_group){
                .lora = q->lora, .row_start = n, .n_rows = q->n_tokens, .logit_start = rows,
                .n_logits = n_logits};
        }
        if (q->n_tokens <= 0 || q->pos0 < 0 || end > tc->max_position_embeddings)
            return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                           "step: sequence %d covers positions [%d, %d), limit %d", s, q->pos0,
                           end, tc->max_position_embeddings);
        if (n + q->n_tokens > l->max_step_tokens)
            return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "step: more than %d tokens",
                           l->max_step_tokens);
        if (q->n_images < 0 || q->n_images > l->max_seq_images)
            return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "step: sequence %d has %d images, limit %d",
                           s, q->n_images, l->max_seq_images);
        if (q->n_images > 0 && (!q->image_states || !q->cross_allowed))
            return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                           "step: sequence %d has %d images but no states or mask", s,
                           q->n_images);
        if (rows + n_logits > l->max_logit_rows)
            return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "step: more than %d logit rows",
                           l->max_logit_rows);
        for (int r = rows; r < rows + n_logits; r++) {
            st = stage_sample_row(m, q, s, r, err, errlen);
            if (st != ML_OK)
                return st;
        }
        rows += n_logits;
        h->seq_start[s] = n;
        h->pos0[s] = q->pos0;
        h->n_images[s] = q->n_images;
        for (int i = 0; i < l->max_seq_images; i++)
            h->image_states[(size_t)s * l->max_seq_images + i] =
                i < q->n_images ? q->image_states[i] : NULL;
        int n_blocks = (end + B - 1) / B;
        memcpy(h->block_tables + (size_t)s * m->max_blocks_per_seq, q->block_table,
               (size_t)n_blocks * sizeof(int32_t));
        int chunks = q->n_images * T;
        for (int t = 0; t < q->n_tokens; t++, n++) {
            int32_t id = q->tokens[t];
            if (id < 0 || id >= embed_rows)
                return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                               "step: token id %d outside the embedding [0, %d)", id, embed_rows);
            int pos = q->pos0 + t;
            h->tokens[n] = id;
            h->pos[n] = pos;
            h->slots[n] = q->block_table[pos / B] * B + pos % B;
            uint8_t *allowed = h->allowed + (size_t)n * stride;
            if (chunks)
                memcpy(allowed, q->cross_allowed + (size_t)t * chunks, (size_t)chunks);
            memset(allowed + chunks, 0, stride - (size_t)chunks);
            /* full_text_row_mask: does the row see any tile (engine/model/README.md §5). */
            int any = 0;
            for (int c = 0; c < chunks; c++)
                any |= allowed[c];
            h->row_mlp[n] = any ? 1.0f : 0.0f;
            h->row_attn[n] = m->limits.row_mask == ML_ROW_MASK_REFERENCE ? h->row_mlp[n]
                             : q->n_images > 0                          ? 1.0f
                                                                        : 0.0f;
        }
    }
    h->seq_start[n_seqs] = n;
    *n_tokens = n;
    *n_rows = rows;
    return ML_OK;
}

/* Upload the staged step: n_seqs sequences of n tokens in all, and with
 * `sample` the sample op's controls of n_rows logit rows and the staged
 * penalty entries. */
static void upload_step(ml_shard *m, int n_seqs, int n, int n_rows, int sample)
{
    ml_backend *be = m->be;
    const ml_step_host *h = &m->host;
    const ml_text_bufs *b = &m->tb;
    size_t images = (size_t)m->limits.max_seq_images;
    size_t chunks = images * m->cfg.vision.max_num_tiles;
    be->ops->upload(be, b->tokens, h->tokens, (size_t)n * sizeof(int32_t));
    be->ops->upload(be, b->pos, h->pos, (size_t)n * sizeof(int32_t));
    be->ops->upload(be, b->slots, h->slots, (size_t)n * sizeof(int32_t));
    be->ops->upload(be, b->row_attn, h->row_attn, (size_t)n * sizeof(float));
    be->ops->upload(be, b->row_mlp, h->row_mlp, (size_t)n * sizeof(float));
    be->ops->upload(be, b->block_tables, h->block_tables,
                    (size_t)n_seqs * m->max_blocks_per_seq * sizeof(int32_t));
    be->ops->upload(be, b->seq_start, h->seq_start, (size_t)(n_seqs + 1) * sizeof(int32_t));
    be->ops->upload(be, b->pos0, h->pos0, (size_t)n_seqs * sizeof(int32_t));
    be->ops->upload(be, b->image_states, h->image_states, (size_t)n_seqs * images * sizeof(void *));
    be->ops->upload(be, b->n_images, h->n_images, (size_t)n_seqs * sizeof(int32_t));
    be->ops->upload(be, b->allowed, h->allowed, (size_t)n * chunks);
    if (sample) {
        be->ops->upload(be, b->sample_rows, h->sample_rows,
                        (size_t)n_rows * sizeof *h->sample_rows);
        be->ops->upload(be, b->pen_id, h->pen_id, (size_t)h->n_pen * sizeof *h->pen_id);
        be->ops->upload(be, b->pen_count, h->pen_count, (size_t)h->n_pen * sizeof *h->pen_count);
        be->ops->upload(be, b->bias, h->bias, (size_t)h->n_bias * sizeof *h->bias);
    }
}

/* ---- layers --------------------------------------------------------------- */

/* The step's adapters as a Linear's rows see them: its groups over the
 * token rows, or with logit_rows over the logit rows (lm_head). */
static ml_lora_rows step_lora(ml_shard *m, int logit_rows)
{
    return (ml_lora_rows){.groups = m->host.lora_groups, .n_groups = m->host.n_lora_groups,
                          .logit_rows = logit_rows, .scratch = m->tb.lora_t};
}

/* MllamaTextMLP: down_proj(silu(gate_proj(x)) * up_proj(x)); x (n, D) is
 * replaced. `site` is the layer's first LoRA site (its q_proj). */
static void mlp(ml_shard *m, const ml_text_layer *L, const ml_lora_rows *lora, int site, int n)
{
    const ml_text_bufs *b = &m->tb;
    int D = m->cfg.text.hidden_size, I = m->dims.intermediate;
    ml_linear(m, b->gate, b->x, &L->gate_proj, NULL, n, D, I, lora, site + ML_LORA_TEXT_GATE);
    ml_linear(m, b->up, b->x, &L->up_proj, NULL, n, D, I, lora, site + ML_LORA_TEXT_UP);
    m->be->ops->silu_mul(m->be, b->gate, b->gate, b->up, (size_t)n * I);
    ml_linear(m, b->x, b->gate, &L->down_proj, NULL, n, I, D, lora, site + ML_LORA_TEXT_DOWN);
    ml_shard_all_reduce(m, b->x, (size_t)n * D);
}

/* MllamaSelfAttentionDecoderLayer: RMSNorm, MllamaTextSelfSdpaAttention
 * (q/k/v, llama3 RoPE, paged causal GQA attention, o_proj), residual;
 * RMSNorm, MllamaTextMLP, residual. */
static void self_layer(ml_shard *m, ml_kv_cache *kv, const ml_text_layer *L, int layer,
                       const ml_lora_rows *lora, int n_seqs, int n)
{
    const ml_text_config *tc = &m->cfg.text;
    ml_backend *be = m->be;
    const ml_backend_ops *op = be->ops;
    const ml_text_bufs *b = &m->tb;
    const ml_text_self_attn *A = &L->self;
    int D = tc->hidden_size, H = m->dims.n_heads, KV = m->dims.n_kv_heads;
    int hd = tc->head_dim, site = ml_lora_site_text(&m->cfg, layer, ML_LORA_TEXT_Q);

    op->rmsnorm(be, b->x, b->h, L->input_layernorm.data, n, D, tc->rms_norm_eps);
    ml_linear(m, b->q, b->x, &A->q_proj, NULL, n, D, H * hd, lora, site + ML_LORA_TEXT_Q);
    ml_linear(m, b->k, b->x, &A->k_proj, NULL, n, D, KV * hd, lora, site + ML_LORA_TEXT_K);
    ml_linear(m, b->v, b->x, &A->v_proj, NULL, n, D, KV * hd, lora, site + ML_LORA_TEXT_V);
    op->rope(be, b->q, b->pos, m->inv_freq, n, H, hd);
    op->rope(be, b->k, b->pos, m->inv_freq, n, KV, hd);
    void *kc = ml_kv_cache_k(kv, m->dims.rank, m->self_index[layer]);
    void *vc = ml_kv_cache_v(kv, m->dims.rank, m->self_index[layer]);
    op->kv_write(be, kc, vc, b->k, b->v, b->slots, n, KV, hd);
    ml_attn_causal_params ap = {
        .out = b->attn, .q = b->q, .k_cache = kc, .v_cache = vc,
        .block_table = b->block_tables, .seq_start = b->seq_start, .pos0 = b->pos0,
        .n_seqs = n_seqs, .max_blocks_per_seq = m->max_blocks_per_seq,
        .block_size = m->limits.kv_block_size, .n_heads = H, .n_kv_heads = KV, .head_dim = hd,
        .scale = 1.0f / sqrtf((float)hd),
    };
    op->attn_causal(be, &ap);
    ml_linear(m, b->x, b->attn, &A->o_proj, NULL, n, H * hd, D, lora, site + ML_LORA_TEXT_O);
    ml_shard_all_reduce(m, b->x, (size_t)n * D);
    op->add_rows(be, b->h, b->x, NULL, 1.0f, n, D);

    op->rmsnorm(be, b->x, b->h, L->post_attention_layernorm.data, n, D, tc->rms_norm_eps);
    mlp(m, L, lora, site, n);
    op->add_rows(be, b->h, b->x, NULL, 1.0f, n, D);
}

/* MllamaCrossAttentionDecoderLayer over every sequence of the step in one
 * attention call: RMSNorm, MllamaTextCrossSdpaAttention (q_proj, q_norm,
 * attention over the image states' K/V, o_proj), tanh-gated residual;
 * RMSNorm, MllamaTextMLP, tanh-gated residual. Rows of text-only sequences
 * get a zero attention output and are left untouched (row_attn = row_mlp =
 * 0), which is what HF's layer skip does for a batch of one. The MLP output
 * is multiplied by the full-text-row mask (row_mlp); the attention output
 * too in the reference mode, not in the transformers one (row_attn,
 * engine/model/README.md §4.6). */
static void cross_layer(ml_shard *m, const ml_text_layer *L, int layer, int cross_idx,
                        const ml_lora_rows *lora, int n_seqs, int n)
{
    const ml_text_config *tc = &m->cfg.text;
    ml_backend *be = m->be;
    const ml_backend_ops *op = be->ops;
    const ml_text_bufs *b = &m->tb;
    const ml_text_cross_attn *A = &L->cross;
    int D = tc->hidden_size, H = m->dims.n_heads, KV = m->dims.n_kv_heads;
    int hd = tc->head_dim, T = m->cfg.vision.max_num_tiles, P = ml_config_num_patches(&m->cfg);
    int site = ml_lora_site_text(&m->cfg, layer, ML_LORA_TEXT_Q);
    size_t plane_bytes = (size_t)T * P * KV * hd * op->kv_elem_size;
    /* An image state holds each cross layer's K plane, then its V plane. */
    size_t k_offset = (size_t)2 * cross_idx * plane_bytes;

    op->rmsnorm(be, b->x, b->h, L->input_layernorm.data, n, D, tc->rms_norm_eps);
    ml_linear(m, b->q, b->x, &A->q_proj, NULL, n, D, H * hd, lora, site + ML_LORA_TEXT_Q);
    op->rmsnorm(be, b->q, b->q, A->q_norm.data, n * H, hd, tc->rms_norm_eps);
    ml_attn_cross_params ap = {
        .out = b->attn, .q = b->q, .states = b->image_states, .k_offset = k_offset,
        .v_offset = k_offset + plane_bytes, .n_images = b->n_images, .seq_start = b->seq_start,
        .allowed = b->allowed, .n_seqs = n_seqs, .n_tokens = n,
        .max_images = m->limits.max_seq_images, .max_tiles = T, .chunk_len = P, .n_heads = H,
        .n_kv_heads = KV, .head_dim = hd, .scale = 1.0f / sqrtf((float)hd),
    };
    op->attn_cross(be, &ap);
    ml_linear(m, b->x, b->attn, &A->o_proj, NULL, n, H * hd, D, lora, site + ML_LORA_TEXT_O);
    ml_shard_all_reduce(m, b->x, (size_t)n * D);
    op->add_rows(be, b->h, b->x, b->row_attn, tanhf(A->attn_gate), n, D);

    op->rmsnorm(be, b->x, b->h, L->post_attention_layernorm.data, n, D, tc->rms_norm_eps);
    mlp(m, L, lora, site, n);
    op->add_rows(be, b->h, b->x, b->row_mlp, tanhf(A->mlp_gate), n, D);
}

/* ---- the step -------------------------------------------------------------- */

/* Embeddings, every layer and the final norm over the staged step, leaving
 * the normed hidden states in b->x. Fetches the op table itself, after any
 * graph_begin, so that a recording backend records these ops. */
static void decoder(ml_shard *m, ml_kv_cache *kv, int n_seqs, int n, int any_images,
                    const ml_text_taps *taps)
{
    const ml_text_config *tc = &m->cfg.text;
    ml_backend *be = m->be;
    const ml_backend_ops *op = be->ops;
    const ml_text_bufs *b = &m->tb;
    int D = tc->hidden_size;
    size_t tap_stride = (size_t)n * D;
    ml_lora_rows lora = step_lora(m, 0);

    op->embed(be, b->h, m->w.text.embed_tokens.data, b->tokens, n, D);
    for (int l = 0; l < tc->num_hidden_layers; l++) {
        if (taps && taps->hidden_states)
            op->download(be, taps->hidden_states + (size_t)l * tap_stride, b->h,
                         tap_stride * sizeof(float));
        const ml_text_layer *L = &m->w.text.layers[l];
        if (!L->is_cross)
            self_layer(m, kv, L, l, &lora, n_seqs, n);
        else if (any_images) /* MllamaTextModel skips cross layers without images (§4.8) */
            cross_layer(m, L, l, ml_config_cross_index(&m->cfg, l), &lora, n_seqs, n);
    }
    op->rmsnorm(be, b->x, b->h, m->w.text.norm.data, n, D, tc->rms_norm_eps);
    if (taps && taps->hidden_states)
        op->download(be, taps->hidden_states + (size_t)tc->num_hidden_layers * tap_stride, b->x,
                     tap_stride * sizeof(float));
}

/* lm_head (untied, no bias) over `rows` (n_rows, D) into b->logits. */
static void lm_head(ml_shard *m, const float *rows, int n_rows)
{
    const ml_text_config *tc = &m->cfg.text;
    ml_lora_rows lora = step_lora(m, 1);
    ml_linear(m, m->tb.logits, rows, &m->w.text.lm_head, NULL, n_rows, tc->hidden_size,
              tc->vocab_size, &lora, ml_lora_site_lm_head(&m->cfg));
}

/* The sample op over the n_rows rows of b->logits into b->sampled, after
 * the constrained sequences' masks: each is waited for here, with the
 * forward pass already queued (on a GPU it runs meanwhile; the mask is then
 * queued behind it), and uploaded to its slice, numbered as stage_sample_row
 * numbered them (sequence order). */
static void sample_step(ml_shard *m, const ml_step_seq *seqs, int n_seqs, int n_rows)
{
    const ml_text_config *tc = &m->cfg.text;
    const ml_text_bufs *b = &m->tb;
    ml_backend *be = m->be;
    size_t words = ((size_t)tc->vocab_size + 63) / 64;
    int k = 0;
    for (int s = 0; s < n_seqs; s++) {
        const ml_step_seq *q = &seqs[s];
        if (q->logits != ML_LOGITS_SAMPLE || !q->mask)
            continue;
        if (q->mask_wait)
            q->mask_wait(q->mask_ctx);
        be->ops->upload(be, b->sample_mask + (size_t)k++ * words, q->mask,
                        words * sizeof *q->mask);
    }
    ml_sample_params p = {.out = b->sampled,
                          .logits = b->logits,
                          .row = b->sample_rows,
                          .pen_id = b->pen_id,
                          .pen_count = b->pen_count,
                          .bias = b->bias,
                          .mask = b->sample_mask,
                          .scratch = b->sample_scratch,
                          .rows = n_rows,
                          .vocab = tc->vocab_size};
    be->ops->sample(be, &p);
}

/* Queue the downloads of the step's results: the logit rows of
 * ML_LOGITS_LAST and ML_LOGITS_ALL sequences into `logits`, one download
 * per run of consecutive rows, and with `sample` every row's sample into
 * m->host.sampled (scattered by scatter_sampled after synchronize). */
static void fetch_results(ml_shard *m, const ml_step_seq *seqs, int n_seqs, float *logits,
                          int sample)
{
    ml_backend *be = m->be;
    size_t row_bytes = (size_t)m->cfg.text.vocab_size * sizeof(float);
    int row = 0, out = 0, run = -1, run_out = 0; /* run: first device row of a run, or -1 */
    for (int s = 0; s <= n_seqs; s++) {
        int wanted = s < n_seqs && wants_rows(&seqs[s]);
        if (wanted && run < 0) {
            run = row;
            run_out = out;
        } else if (!wanted && run >= 0) {
            be->ops->download(be, (char *)logits + (size_t)run_out * row_bytes,
                              (const char *)m->tb.logits + (size_t)run * row_bytes,
                              (size_t)(out - run_out) * row_bytes);
            run = -1;
        }
        if (s == n_seqs)
            break;
        row += logit_rows(&seqs[s]);
        out += wanted ? logit_rows(&seqs[s]) : 0;
    }
    if (sample)
        be->ops->download(be, m->host.sampled, m->tb.sampled,
                          (size_t)row * sizeof *m->host.sampled);
}

/* After synchronize: each ML_LOGITS_SAMPLE sequence's result to its *sampled. */
static void scatter_sampled(const ml_shard *m, const ml_step_seq *seqs, int n_seqs)
{
    int row = 0;
    for (int s = 0; s < n_seqs; s++) {
        if (seqs[s].logits == ML_LOGITS_SAMPLE)
            *seqs[s].sampled = m->host.sampled[row];
        row += logit_rows(&seqs[s]);
    }
}

/* ---- decode graphs ------------------------------------------------------------ */

/* A pure decode step (every sequence one token and its logits, no adapter,
 * no taps) issues the same ops for every batch of the same size: only the
 * staged inputs differ, and every op reads those from backend memory when
 * it runs. Such a step is padded to its bucket (the next power of two,
 * capped by max_step_seqs), recorded once per (bucket, images or not) into
 * a backend graph slot and replayed from then on: on CUDA one launch
 * instead of ~10^3. Padding sequences are one token at position 0 with no
 * images and cache slot -1 (kv_write skips it); their rows are computed
 * and never read, and every op keeps rows of different sequences apart. */

/* The graph slot of this step, or -1 when it must run op by op; *bucket
 * receives the padded batch size. */
static int decode_slot(ml_shard *m, const ml_kv_cache *kv, const ml_step_seq *seqs,
                       int n_seqs, int any_images, const ml_text_taps *taps, int *bucket)
{
    const ml_backend_ops *op = m->be->ops;
    if (!m->limits.decode_graphs || !op->graph_begin || taps || m->host.n_lora_groups > 0)
        return -1;
    for (int s = 0; s < n_seqs; s++)
        if (seqs[s].n_tokens != 1 || seqs[s].logits == ML_LOGITS_NONE)
            return -1;
    int b = 1, index = 0;
    while (b < n_seqs) {
        b *= 2;
        index++;
    }
    if (b > m->limits.max_step_seqs)
        b = m->limits.max_step_seqs;
    int slot = 2 * index + any_images;
    if (slot >= op->n_graph_slots || slot >= ML_GRAPH_SLOTS)
        return -1;
    if (ml_kv_cache_id(kv) != m->graph_kv) { /* recorded graphs name another cache's pools */
        memset(m->graph_recorded, 0, sizeof m->graph_recorded);
        m->graph_kv = ml_kv_cache_id(kv);
    }
    *bucket = b;
    return slot;
}

/* Stage padding sequences n_seqs .. bucket-1 after the real ones. */
static void pad_step(ml_shard *m, int n_seqs, int bucket)
{
    ml_step_host *h = &m->host;
    size_t images = (size_t)m->limits.max_seq_images;
    size_t stride = images * m->cfg.vision.max_num_tiles;
    for (int s = n_seqs; s < bucket; s++) {
        h->seq_start[s + 1] = s + 1;
        h->pos0[s] = 0;
        h->n_images[s] = 0;
        for (size_t i = 0; i < images; i++)
            h->image_states[(size_t)s * images + i] = NULL;
        h->block_tables[(size_t)s * m->max_blocks_per_seq] = 0;
        h->tokens[s] = 0;
        h->pos[s] = 0;
        h->slots[s] = -1;
        h->row_attn[s] = 0.0f;
        h->row_mlp[s] = 0.0f;
        h->sample_rows[s] = unsampled_row;
        memset(h->allowed + (size_t)s * stride, 0, stride);
    }
}

/* The recording ends at the logits: the sample op follows it unrecorded, so
 * that the constrained sequences' masks can be waited for while the replay
 * runs (one launch more than recording it too). */
static void decode_replay(ml_shard *m, ml_kv_cache *kv, int slot, int bucket, int any_images)
{
    ml_backend *be = m->be;
    if (!m->graph_recorded[slot]) {
        be->ops->graph_begin(be, slot);
        decoder(m, kv, bucket, bucket, any_images, NULL);
        lm_head(m, m->tb.x, bucket);
        be->ops->graph_end(be, slot);
        m->graph_recorded[slot] = 1;
    }
    be->ops->graph_replay(be, slot);
}

ml_status ml_shard_forward(ml_shard *m, ml_kv_cache *kv, const ml_step_seq *seqs, int n_seqs,
                           float *logits, const ml_text_taps *taps, char *err, size_t errlen)
{
    const ml_text_config *tc = &m->cfg.text;
    ml_backend *be = m->be;
    const ml_text_bufs *b = &m->tb;
    int D = tc->hidden_size, n = 0, n_rows = 0;
    ml_status st = stage_step(m, kv, seqs, n_seqs, &n, &n_rows, err, errlen);
    if (st != ML_OK)
        return st;
    int any_images = 0, any_sample = 0;
    for (int s = 0; s < n_seqs; s++) {
        any_images |= seqs[s].n_images > 0;
        any_sample |= seqs[s].logits == ML_LOGITS_SAMPLE;
    }

    int bucket = 0;
    int slot = decode_slot(m, kv, seqs, n_seqs, any_images, taps, &bucket);
    if (slot >= 0) {
        /* Every row is sampled: one shape serves steps with and without
         * sampled sequences. */
        pad_step(m, n_seqs, bucket);
        upload_step(m, bucket, bucket, bucket, 1);
        decode_replay(m, kv, slot, bucket, any_images);
        sample_step(m, seqs, n_seqs, bucket);
    } else {
        upload_step(m, n_seqs, n, n_rows, any_sample);
        decoder(m, kv, n_seqs, n, any_images, taps);
        /* Gather the rows that want logits unless that is every row. */
        const float *rows = b->x;
        if (n_rows > 0 && n_rows < n) {
            int r = 0;
            for (int s = 0; s < n_seqs; s++) {
                int count = logit_rows(&seqs[s]);
                int first = m->host.seq_start[s] + seqs[s].n_tokens - count;
                if (count == 0)
                    continue;
                be->ops->copy_2d(be, b->rows + (size_t)r * D, b->x + (size_t)first * D, count,
                                 D, (size_t)D, 1, (size_t)D);
                r += count;
            }
            rows = b->rows;
        }
        if (n_rows > 0)
            lm_head(m, rows, n_rows);
        if (n_rows > 0 && any_sample)
            sample_step(m, seqs, n_seqs, n_rows);
    }
    fetch_results(m, seqs, n_seqs, logits, any_sample);
    st = be->ops->synchronize(be, err, errlen);
    if (st == ML_OK)
        scatter_sampled(m, seqs, n_seqs);
    else if (slot >= 0) /* a failed recording leaves its slot empty */
        m->graph_recorded[slot] = 0;
    return st;
}
