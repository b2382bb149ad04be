/* The vision tower, the projector and the cross-attention K/V of one image
 * (transformers v4.47 MllamaVisionModel.forward, MllamaMultiModalProjector,
 * and the k/v half of MllamaTextCrossSdpaAttention; engine/model/README.md §3, §8).
 *
 * Shapes: T = max_num_tiles, P = patches per tile + CLS (1601), Pp = P
 * padded to a multiple of 8 (1608), S = T·Pp (6432), D_v = vision hidden,
 * I_v = vision MLP width, D = text hidden. Under tensor parallelism
 * (shard.h ml_shard_dims) a shard holds heads/N attention heads (q, k,
 * v and attn are (S, D_a) with D_a = D_v/N), I_v/N MLP channels and KV/N
 * cross K/V heads; o_proj and fc2 produce partial sums that are all-reduced.
 *
 * LoRA: the image's adapter (if any) is one segment of every adaptable
 * Linear here (ml_linear, linear.h), over all S (or T·P) rows, pads
 * included as HF computes them: vision adapters are segmented per image,
 * never by text tokens. */
#include <math.h>
#include <string.h>

#include "model/linear.h"
#include "model/lora_internal.h"
#include "model/memory_plan.h"
#include "model/model_internal.h"
#include "model/shard.h"

/* layernorm_pre/post are nn.LayerNorm(hidden_size) with the default eps,
 * not vision_config.norm_eps (MllamaVisionModel.__init__). */
#define VISION_OUTER_LN_EPS 1e-5f

size_t ml_shard_image_state_bytes(const ml_shard *m)
{
    return (size_t)ml_memory_plan_image_state_bytes(&m->cfg, m->dims.world,
                                                    m->be->ops->kv_elem_size);
}

/* The image's adapter (if any) as a Linear over `rows` rows sees it: one
 * group *g of every row, or none. */
static ml_lora_rows image_lora(ml_shard *m, const ml_lora *lora, int rows, ml_lora_group *g)
{
    *g = (ml_lora_group){.lora = lora, .row_start = 0, .n_rows = rows};
    return (ml_lora_rows){.groups = g, .n_groups = lora ? 1 : 0, .scratch = m->vb.lora_t};
}

/* MllamaVisionEncoderLayer: pre-norm attention and MLP blocks, each added
 * to the residual stream through tanh(gate) for global layers and with
 * weight 1 for local ones. h (S, D_v) is updated in place. `lora` covers
 * the S rows; `site` is the layer's first LoRA site (its q_proj). */
static void encoder_layer(ml_shard *m, const ml_vision_dims *d, const ml_vision_layer *L,
                          const ml_lora_rows *lora, int site)
{
    ml_backend *be = m->be;
    const ml_backend_ops *op = be->ops;
    const ml_vision_bufs *b = &m->vb;
    float eps = m->cfg.vision.norm_eps;
    float gate_attn = L->is_gated ? tanhf(L->gate_attn) : 1.0f;
    float gate_ffn = L->is_gated ? tanhf(L->gate_ffn) : 1.0f;

    /* MllamaVisionSdpaAttention: q/k/v/o without bias, 16 heads of 80. */
    op->layernorm(be, b->x, b->h, L->input_layernorm_weight.data, L->input_layernorm_bias.data,
                  d->S, d->Dv, eps);
    ml_linear(m, b->q, b->x, &L->q_proj, NULL, d->S, d->Dv, d->Da, lora, site + ML_LORA_VISION_Q);
    ml_linear(m, b->k, b->x, &L->k_proj, NULL, d->S, d->Dv, d->Da, lora, site + ML_LORA_VISION_K);
    ml_linear(m, b->v, b->x, &L->v_proj, NULL, d->S, d->Dv, d->Da, lora, site + ML_LORA_VISION_V);
    ml_attn_vision_params ap = {
        .out = b->attn, .q = b->q, .k = b->k, .v = b->v, .valid = b->valid,
        .n_seq = 1, .seq_len = d->S, .n_heads = d->heads, .head_dim = d->hd,
        .scale = 1.0f / sqrtf((float)d->hd),
    };
    op->attn_vision(be, &ap);
    ml_linear(m, b->x, b->attn, &L->o_proj, NULL, d->S, d->Da, d->Dv, lora,
              site + ML_LORA_VISION_O);
    ml_shard_all_reduce(m, b->x, (size_t)d->S * d->Dv);
    op->add_rows(be, b->h, b->x, NULL, gate_attn, d->S, d->Dv);

    /* MllamaVisionMLP: fc1 (+bias), exact GELU, fc2 (+bias). */
    op->layernorm(be, b->x, b->h, L->post_attention_layernorm_weight.data,
                  L->post_attention_layernorm_bias.data, d->S, d->Dv, eps);
    ml_linear(m, b->mlp, b->x, &L->fc1_weight, &L->fc1_bias, d->S, d->Dv, d->Iv, lora,
              site + ML_LORA_VISION_FC1);
    op->gelu(be, b->mlp, (size_t)d->S * (size_t)d->Iv);
    ml_linear(m, b->x, b->mlp, &L->fc2_weight, &L->fc2_bias, d->S, d->Iv, d->Dv, lora,
              site + ML_LORA_VISION_FC2);
    ml_shard_all_reduce(m, b->x, (size_t)d->S * d->Dv);
    op->add_rows(be, b->h, b->x, NULL, gate_ffn, d->S, d->Dv);
}

/* Store hidden_states[layer] (the input of local layer `layer`, engine/model/README.md
 * §3.7) into every intermediate slot k with intermediate_layers_indices[k]
 * == layer: vision output channel D_v + c·n_inter + k for hidden channel c
 * (torch.stack(..., dim=-1) then flatten: interleaved, §3.12). Pad tokens
 * are dropped. */
static void collect_intermediate(ml_shard *m, const ml_vision_dims *d, int layer)
{
    const ml_vision_config *vc = &m->cfg.vision;
    const ml_vision_bufs *b = &m->vb;
    for (int k = 0; k < d->n_inter; k++) {
        if (vc->intermediate_layers_indices[k] != layer)
            continue;
        for (int t = 0; t < d->T; t++)
            m->be->ops->copy_2d(m->be, b->vout + (size_t)t * d->P * d->vout + d->Dv + k,
                                b->h + (size_t)t * d->Pp * d->Dv, d->P, d->Dv,
                                (size_t)d->vout, (size_t)d->n_inter, (size_t)d->Dv);
    }
}

/* MllamaVisionModel.forward up to the concatenated output (T·P, vout);
 * `lora` covers the S rows of the encoders. */
static void vision_tower(ml_shard *m, const ml_vision_dims *d, int ar_id, const ml_lora_rows *lora)
{
    ml_backend *be = m->be;
    const ml_backend_ops *op = be->ops;
    const ml_vision_weights *w = &m->w.vision;
    const ml_vision_bufs *b = &m->vb;
    size_t tile = (size_t)d->Pp * d->Dv; /* floats per padded tile in h */

    /* Patch conv as im2col + matmul, written after each tile's CLS slot;
     * pad rows stay zero (F.pad after layernorm_pre). */
    op->zero(be, b->h, (size_t)d->S * d->Dv);
    op->patchify(be, b->patches, b->pixels, d->T, d->side, d->patch);
    for (int t = 0; t < d->T; t++)
        op->matmul(be, b->h + t * tile + d->Dv,
                   b->patches + (size_t)t * (d->P - 1) * d->patch_len,
                   w->patch_embedding.data, NULL, d->P - 1, d->patch_len, d->Dv, 0);

    /* MllamaPrecomputedAspectRatioEmbedding (pre-tile, gated) on the patches,
     * then apply_class_embedding, then MllamaPrecomputedPositionEmbedding:
     * (1 - tanh g)·position + tanh g·tile_embedding[ar_id]. */
    float pre_gate = tanhf(w->pre_tile_gate), pos_gate = tanhf(w->position_gate);
    for (int t = 0; t < d->T; t++) {
        float *ht = b->h + t * tile;
        op->add_bf16(be, ht + d->Dv,
                     w->pre_tile_embedding.data + ((size_t)ar_id * d->T + t) * d->Dv, pre_gate,
                     d->P - 1, 1, d->Dv);
        op->add_bf16(be, ht, w->class_embedding.data, 1.0f, 1, 1, d->Dv);
        op->add_bf16(be, ht, w->position_embedding.data, 1.0f - pos_gate, d->P, d->P, d->Dv);
        op->add_bf16(be, ht,
                     w->tile_position_embedding.data + ((size_t)ar_id * d->T + t) * d->P * d->Dv,
                     pos_gate, d->P, d->P, d->Dv);
        op->layernorm(be, ht, ht, w->layernorm_pre_weight.data, w->layernorm_pre_bias.data, d->P,
                      d->Dv, VISION_OUTER_LN_EPS);
    }

    /* Local transformer, collecting hidden_states[i] = input of layer i. */
    for (int i = 0; i < w->n_layers; i++) {
        collect_intermediate(m, d, i);
        encoder_layer(m, d, &w->layers[i], lora,
                      ml_lora_site_vision(&m->cfg, 0, i, ML_LORA_VISION_Q));
    }
    collect_intermediate(m, d, w->n_layers);

    /* layernorm_post over every token (pads included, as HF), post-tile
     * embedding on all Pp tokens of each tile, then the gated transformer. */
    op->layernorm(be, b->h, b->h, w->layernorm_post_weight.data, w->layernorm_post_bias.data,
                  d->S, d->Dv, VISION_OUTER_LN_EPS);
    float post_gate = tanhf(w->post_tile_gate);
    for (int t = 0; t < d->T; t++)
        op->add_bf16(be, b->h + t * tile,
                     w->post_tile_embedding.data + ((size_t)ar_id * d->T + t) * d->Dv, post_gate,
                     d->Pp, 1, d->Dv);
    for (int i = 0; i < w->n_global_layers; i++)
        encoder_layer(m, d, &w->global_layers[i], lora,
                      ml_lora_site_vision(&m->cfg, 1, i, ML_LORA_VISION_Q));

    /* Global output, pads dropped, into channels [0, D_v). */
    for (int t = 0; t < d->T; t++)
        op->copy_2d(be, b->vout + (size_t)t * d->P * d->vout, b->h + t * tile, d->P, d->Dv,
                    (size_t)d->vout, 1, (size_t)d->Dv);
}

ml_status ml_shard_encode_image(ml_shard *m, const float *pixels, int aspect_ratio_id,
                                const uint8_t *aspect_ratio_mask, const ml_lora *lora,
                                void *state, const ml_vision_taps *taps, char *err,
                                size_t errlen)
{
    ml_vision_dims d = ml_vision_dims_of(m);
    ml_backend *be = m->be;
    const ml_backend_ops *op = be->ops;
    const ml_vision_bufs *b = &m->vb;
    int n_ids = ml_config_n_aspect_ratio_ids(&m->cfg);
    if (aspect_ratio_id < 0 || aspect_ratio_id >= n_ids)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "aspect_ratio_id %d outside [0, %d)",
                       aspect_ratio_id, n_ids);
    if (lora && lora->shard != m)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "encode: the adapter slot belongs to another model");

    /* _prepare_aspect_ratio_attention_mask: token p of tile t is valid when
     * the tile is real and p is not padding (engine/model/README.md §3.6). */
    uint8_t valid[ML_VISION_MAX_TOKENS];
    if (d.S > ML_VISION_MAX_TOKENS)
        return ml_fail(err, errlen, ML_ERR_UNSUPPORTED, "vision sequence of %d tokens above %d",
                       d.S, ML_VISION_MAX_TOKENS);
    for (int t = 0; t < d.T; t++)
        for (int p = 0; p < d.Pp; p++)
            valid[t * d.Pp + p] = aspect_ratio_mask[t] && p < d.P;
    op->upload(be, b->valid, valid, (size_t)d.S);
    op->upload(be, b->pixels, pixels,
               (size_t)d.T * m->cfg.vision.num_channels * d.side * d.side * sizeof(float));

    size_t tp = (size_t)d.T * d.P;
    /* Keys a text row can attend to: in the reference row-mask mode those
     * of the tiles up to the image's last real one (engine/model/README.md
     * §8); in transformers' mode a row that sees no tile attends to every
     * slot. The tower runs over every tile (real tokens attend to the
     * padding ones); the projector and the cross K/V skip the rest, whose
     * slots of the state are zeros. A projector tap gets every tile. */
    size_t kv_rows = tp;
    if (m->limits.row_mask == ML_ROW_MASK_REFERENCE) {
        int tiles = 1;
        for (int t = 1; t < d.T; t++)
            if (aspect_ratio_mask[t])
                tiles = t + 1;
        kv_rows = (size_t)tiles * d.P;
    }
    const size_t proj_rows = taps && taps->projector_output ? tp : kv_rows;
    ml_lora_group tokens_group, proj_group, kv_group;
    ml_lora_rows tokens = image_lora(m, lora, d.S, &tokens_group);
    ml_lora_rows proj_lora = image_lora(m, lora, (int)proj_rows, &proj_group);
    ml_lora_rows kv_lora = image_lora(m, lora, (int)kv_rows, &kv_group);

    vision_tower(m, &d, aspect_ratio_id, &tokens);

    /* MllamaMultiModalProjector: (T·P, vout) → (T·P, D). */
    ml_linear(m, b->proj, b->vout, &m->w.projector_weight, &m->w.projector_bias, (int)proj_rows,
              d.vout, d.D, &proj_lora, ml_lora_site_projector(&m->cfg));

    /* MllamaTextCrossSdpaAttention's k_proj (then k_norm) and v_proj of
     * every cross layer over the image's tokens: state = [cross layer][K,
     * V] planes of T·P keys in the kv type, K in the backend's layout
     * (kv_store_keys), V (T·P, KV, hd). */
    const ml_text_config *tc = &m->cfg.text;
    size_t plane = tp * (size_t)d.kv_width;
    size_t plane_bytes = plane * op->kv_elem_size;
    /* Zeros in the skipped rows, which no later Linear writes: each plane
     * is stored whole, in the backend's layout (K transposed on the CPU). */
    if (kv_rows < tp)
        op->zero(be, b->kv_tmp + kv_rows * d.kv_width, (tp - kv_rows) * d.kv_width);
    char *dst = state;
    for (int l = 0; l < tc->num_hidden_layers; l++) {
        const ml_text_layer *L = &m->w.text.layers[l];
        if (!L->is_cross)
            continue;
        ml_linear(m, b->kv_tmp, b->proj, &L->cross.k_proj, NULL, (int)kv_rows, d.D, d.kv_width,
                  &kv_lora, ml_lora_site_text(&m->cfg, l, ML_LORA_TEXT_K));
        op->rmsnorm(be, b->kv_tmp, b->kv_tmp, L->cross.k_norm.data,
                    (int)kv_rows * m->dims.n_kv_heads, tc->head_dim, tc->rms_norm_eps);
        op->kv_store_keys(be, dst, b->kv_tmp, (int)tp, m->dims.n_kv_heads, tc->head_dim);
        dst += plane_bytes;
        ml_linear(m, b->kv_tmp, b->proj, &L->cross.v_proj, NULL, (int)kv_rows, d.D, d.kv_width,
                  &kv_lora, ml_lora_site_text(&m->cfg, l, ML_LORA_TEXT_V));
        op->kv_store(be, dst, b->kv_tmp, plane);
        dst += plane_bytes;
    }

    if (taps && taps->vision_output)
        op->download(be, taps->vision_output, b->vout, tp * d.vout * sizeof(float));
    if (taps && taps->projector_output)
        op->download(be, taps->projector_output, b->proj, tp * d.D * sizeof(float));
    return op->synchronize(be, err, errlen);
}
