/* Continuous batching over one model (runtime.h): the runtime object, its
 * budgets and scratch made at create, and the queries. A sequence's life is
 * sequence.c, the step scheduler.c; runtime_internal.h is what they share. */
#include <stdlib.h>

#include "runtime/runtime_internal.h"

/* ---- create / destroy ------------------------------------------------------ */

ml_status ml_runtime_create(ml_runtime **out, ml_model *model, const ml_tokenizer *tok,
                            const ml_runtime_config *cfg, char *err, size_t errlen)
{
    *out = NULL;
    const ml_config *mc = ml_model_config(model);
    const ml_model_limits *lim = ml_model_limits_of(model);
    if (cfg->max_running <= 0 || cfg->max_running > lim->max_step_seqs ||
        cfg->max_step_tokens < cfg->max_running || cfg->max_step_tokens > lim->max_step_tokens)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "runtime: max_running %d and max_step_tokens %d must fit the model "
                       "limits (%d sequences, %d tokens)",
                       cfg->max_running, cfg->max_step_tokens, lim->max_step_seqs,
                       lim->max_step_tokens);
    if (cfg->max_adapters < 0)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "runtime: max_adapters %d",
                       cfg->max_adapters);
    if (mc->vision.max_num_tiles > ML_RUNTIME_MAX_TILES)
        return ml_fail(err, errlen, ML_ERR_UNSUPPORTED, "runtime: max_num_tiles %d above %d",
                       mc->vision.max_num_tiles, ML_RUNTIME_MAX_TILES);
    ml_runtime *rt = calloc(1, sizeof *rt);
    if (!rt)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "runtime: out of memory");
    rt->model = model;
    rt->tok = tok;
    rt->cfg = *cfg;
    rt->block_size = lim->kv_block_size;
    rt->context = mc->text.max_position_embeddings;
    rt->max_blocks = (rt->context + rt->block_size - 1) / rt->block_size;
    rt->vocab = mc->text.vocab_size;
    rt->max_tiles = mc->vision.max_num_tiles;
    rt->next_handle = 1;

    /* Budgets are per device: under tensor parallelism every device holds
     * its shard's share of each block and each image state. */
    size_t n_blocks = cfg->kv_bytes / ml_model_kv_block_bytes(model);
    if (n_blocks > INT32_MAX)
        n_blocks = INT32_MAX;
    ml_status st = ml_model_kv_cache_create(&rt->kv, model, (int)n_blocks, err, errlen);
    if (st == ML_OK)
        st = ml_sampler_create((size_t)rt->vocab, &rt->sampler, err, errlen);
    if (st == ML_OK)
        st = ml_image_cache_create(&rt->images, model, cfg->image_bytes, cfg->on_image_event,
                                   cfg->image_event_ctx, err, errlen);
    if (st == ML_OK && cfg->max_adapters > 0)
        st = ml_adapters_create(&rt->adapters, model, cfg->max_adapters,
                                cfg->max_adapter_rank ? cfg->max_adapter_rank
                                                      : lim->max_lora_rank,
                                cfg->resolve_adapter, cfg->resolve_adapter_ctx, err, errlen);
    if (st != ML_OK) {
        ml_runtime_destroy(rt);
        return st;
    }
    rt->step = calloc((size_t)cfg->max_running, sizeof *rt->step);
    rt->step_owner = calloc((size_t)cfg->max_running, sizeof *rt->step_owner);
    rt->allowed = malloc((size_t)cfg->max_step_tokens * lim->max_seq_images * rt->max_tiles + 1);
    rt->logits = malloc((size_t)cfg->max_running * rt->vocab * sizeof(float));
    if (!rt->step || !rt->step_owner || !rt->allowed || !rt->logits) {
        ml_runtime_destroy(rt);
        return ml_fail(err, errlen, ML_ERR_NOMEM, "runtime: out of memory");
    }
    *out = rt;
    return ML_OK;
}

void ml_runtime_destroy(ml_runtime *rt)
{
    if (!rt)
        return;
    while (rt->running.head)
        ml_rt_seq_finish(rt, seq_of(rt->running.head), ML_FINISH_REASON_CANCELLED, ML_REQERR_NONE,
                         "runtime shut down", 1);
    while (rt->waiting.head)
        ml_rt_seq_finish(rt, seq_of(rt->waiting.head), ML_FINISH_REASON_CANCELLED, ML_REQERR_NONE,
                         "runtime shut down", 1);
    ml_image_cache_destroy(rt->images);
    ml_adapters_destroy(rt->adapters);
    ml_kv_cache_destroy(rt->kv);
    ml_sampler_destroy(rt->sampler);
    free(rt->step);
    free(rt->step_owner);
    free(rt->allowed);
    free(rt->logits);
    ml_masker_destroy(rt->masker);
    ml_json_vocab_destroy(rt->json_vocab);
    free(rt);
}

/* ---- queries --------------------------------------------------------------- */

int ml_runtime_active(const ml_runtime *rt)
{
    return rt->waiting.n + rt->running.n + rt->n_unforked;
}
ml_image_cache *ml_runtime_image_cache(ml_runtime *rt) { return rt->images; }

void ml_runtime_get_stats(const ml_runtime *rt, ml_runtime_stats *st)
{
    *st = rt->stats;
    st->waiting = rt->waiting.n;
    st->running = rt->running.n;
    st->kv_blocks_total = ml_kv_cache_n_blocks(rt->kv);
    st->kv_blocks_free = ml_kv_cache_n_free(rt->kv);
    st->kv_blocks_cached = ml_kv_cache_n_published(rt->kv);
    st->kv_blocks_evicted = ml_kv_cache_evictions(rt->kv);
    st->image_bytes_used = ml_image_cache_used(rt->images);
    st->image_bytes_budget = ml_image_cache_budget(rt->images);
    if (rt->adapters)
        ml_adapters_get_stats(rt->adapters, &st->adapters);
}
