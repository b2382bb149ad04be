/* Continuous batching over one model: admission, paged K/V blocks, resident
 * image states, LoRA adapter slots, chunked prefill, preemption by
 * recompute, sampling and streaming (runtime.h). */
#include "runtime/runtime.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/json_mode.h"
#include "list.h"
#include "runtime/stop.h"
#include "sha256.h"

/* ========================================================================== */
/* sequences                                                                    */
/* ========================================================================== */

typedef enum seq_state {
    SEQ_WAITING,
    SEQ_RUNNING,
} seq_state;

typedef struct rt_seq {
    uint64_t handle;
    seq_state state;
    ml_list_node link;          /* in the waiting or running list, as state says */

    int32_t *tokens;            /* owned (cap): prompt then generated tokens */
    int n_tokens, n_prompt, cap;
    int n_cached;               /* tokens whose K/V are in the cache */
    int32_t *blocks;            /* owned (max_blocks): the block table */
    int n_blocks;

    int n_images;
    ml_request_image *images;   /* owned (n_images): pixels owned until encoded */
    ml_image_entry **entries;   /* owned (n_images): acquired cache entries, NULL until admitted */
    const void **states;        /* owned (n_images): their backend states, for the model */
    int *range_start, *range_end; /* owned (n_images): token ranges of the cross mask */

    char *adapter_name;         /* owned: the request's adapter, NULL for the base model */
    ml_adapter *adapter;        /* referenced from admission to the end; NULL until then */

    ml_sampling_params sampling; /* stop strings borrowed from stop_text */
    ml_sample_row row;          /* the step's sampling controls (ML_LOGITS_SAMPLE) */
    ml_sample_out sampled;      /* the step's token and logprobs */
    char *stop_text;            /* owned: the request's stop strings, back to back */
    ml_sampler_seq *sampler;    /* owned */
    ml_json_state *json;        /* owned; JSON mode only */
    ml_token_stream *detok;     /* owned */
    ml_stop *stop;              /* owned */
    ml_request_callbacks cb;
    int64_t deadline_ms;
    ml_usage usage;
    double t_submit, t_admit, t_first;
} rt_seq;

struct ml_runtime {
    ml_model *model;            /* borrowed */
    const ml_tokenizer *tok;    /* borrowed */
    ml_runtime_config cfg;
    ml_kv_cache *kv;            /* owned */
    ml_sampler *sampler;        /* owned: sampling scratch shared by all sequences */
    ml_image_cache *images;     /* owned */
    ml_adapters *adapters;      /* owned; NULL without adapter slots */
    int block_size, max_blocks, vocab, max_tiles, context;
    uint64_t next_handle;
    /* Of rt_seq.link. waiting is the FCFS queue, preempted sequences at its
     * front; running is in admission order, the newest at the tail. */
    ml_list waiting, running;
    /* Per-step scratch, sized at create. */
    ml_step_seq *step;          /* (max_running) */
    rt_seq **step_owner;        /* (max_running) */
    uint8_t *allowed;           /* (max_step_tokens, max_seq_images · T) */
    float *logits;              /* (max_running, vocab) */
    /* JSON mode, made at the first request that asks for it: */
    ml_json_vocab *json_vocab;  /* owned: the tokens' bytes for the grammar */
    uint64_t *json_allowed;     /* owned ((vocab + 63) / 64): one step's mask */
    ml_runtime_stats stats;
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The sequence linked by n; NULL for NULL (the end of a list). */
static rt_seq *seq_of(ml_list_node *n) { return ml_list_entry(n, rt_seq, link); }

/* Release the K/V blocks of s; its cached prefix is forgotten. */
static void release_blocks(ml_runtime *rt, rt_seq *s)
{
    for (int i = 0; i < s->n_blocks; i++)
        ml_kv_cache_release(rt->kv, s->blocks[i]);
    s->n_blocks = 0;
    s->n_cached = 0;
}

static void seq_free(ml_runtime *rt, rt_seq *s)
{
    release_blocks(rt, s);
    if (s->adapter)
        ml_adapters_release(rt->adapters, s->adapter);
    free(s->adapter_name);
    for (int i = 0; i < s->n_images; i++) {
        if (s->entries && s->entries[i])
            ml_image_cache_release(rt->images, s->entries[i]);
        if (s->images)
            free(s->images[i].pixels);
    }
    free(s->images);
    free(s->entries);
    free(s->states);
    free(s->range_start);
    free(s->range_end);
    free(s->tokens);
    free(s->blocks);
    free(s->stop_text);
    ml_sampler_seq_destroy(s->sampler);
    ml_json_state_destroy(s->json);
    ml_token_stream_destroy(s->detok);
    ml_stop_destroy(s->stop);
    free(s);
}

/* Remove s from its list, release everything and report the end. With
 * emit_tail, text held back by the detokenizer and the stop matcher goes
 * out with the finish; after a stop string or an error it is dropped. */
static void finish(ml_runtime *rt, rt_seq *s, ml_finish_reason reason, ml_request_error error,
                   const char *message, int emit_tail)
{
    ml_list_remove(s->state == SEQ_RUNNING ? &rt->running : &rt->waiting, &s->link);
    /* The tail: what the stop matcher released for the detokenizer's last
     * partial character, then what it still held. Bounded by the longest
     * stop string plus one replacement character. */
    char tail[2 * ML_STOP_MAX_LEN];
    size_t tail_len = 0;
    if (emit_tail && s->detok && s->stop) {
        const char *piece;
        size_t n;
        ml_token_stream_flush(s->detok, &piece, &n);
        ml_stop_out r = {0};
        if (ml_stop_feed(s->stop, piece, n, &r, NULL, 0) == ML_OK && r.len <= sizeof tail) {
            memcpy(tail, r.text, r.len);
            tail_len = r.len;
        }
        if (!r.stopped) {
            ml_stop_flush(s->stop, &r);
            if (tail_len + r.len <= sizeof tail) {
                memcpy(tail + tail_len, r.text, r.len);
                tail_len += r.len;
            }
        }
    }
    double t = now_ms();
    if (s->t_first > 0)
        s->usage.decode_ms = t - s->t_first;
    s->usage.completion_tokens = s->n_tokens - s->n_prompt;
    ml_request_callbacks cb = s->cb;
    ml_usage usage = s->usage;
    /* Free first, so the callback sees the memory already returned. */
    seq_free(rt, s);
    cb.on_finish(cb.ctx, tail, tail_len, reason, error, message, &usage);
}

/* ========================================================================== */
/* cross-attention mask                                                         */
/* ========================================================================== */

/* get_cross_attention_token_mask (processing_mllama, engine/model/README.md §5): image
 * k covers tokens [loc_k, loc_{k+1}), the last one up to the end; an image
 * token immediately followed by another image token extends to the end of
 * the following range. Ends are exclusive; INT_MAX-like "end of sequence"
 * is n_prompt, and decode tokens reuse the last prompt row (§8). */
static void image_ranges(rt_seq *s, int32_t image_token)
{
    int k = 0;
    for (int t = 0; t < s->n_prompt && k < s->n_images; t++)
        if (s->tokens[t] == image_token)
            s->range_start[k++] = t;
    for (k = 0; k < s->n_images; k++)
        s->range_end[k] = k + 1 < s->n_images ? s->range_start[k + 1] : s->n_prompt;
    int last_end = s->n_images ? s->range_end[s->n_images - 1] : 0;
    for (k = s->n_images - 1; k >= 0; k--) {
        if (s->range_start[k] == s->range_end[k] - 1)
            s->range_end[k] = last_end;
        last_end = s->range_end[k];
    }
}

/* allowed rows for tokens [pos, pos + n) of s: (n, n_images · T). */
static void fill_allowed(const ml_runtime *rt, const rt_seq *s, int pos, int n, uint8_t *out)
{
    int T = rt->max_tiles, chunks = s->n_images * T;
    for (int t = 0; t < n; t++) {
        int row = pos + t < s->n_prompt ? pos + t : s->n_prompt - 1;
        uint8_t *o = out + (size_t)t * chunks;
        for (int k = 0; k < s->n_images; k++) {
            int in = row >= s->range_start[k] && row < s->range_end[k];
            for (int tile = 0; tile < T; tile++)
                o[k * T + tile] = in && tile < s->images[k].n_tiles;
        }
    }
}

/* ========================================================================== */
/* create / submit / cancel                                                     */
/* ========================================================================== */

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
        finish(rt, seq_of(rt->running.head), ML_FINISH_REASON_CANCELLED, ML_REQERR_NONE,
               "runtime shut down", 1);
    while (rt->waiting.head)
        finish(rt, seq_of(rt->waiting.head), ML_FINISH_REASON_CANCELLED, ML_REQERR_NONE,
               "runtime shut down", 1);
    ml_image_cache_destroy(rt->images);
    ml_adapters_destroy(rt->adapters);
    ml_kv_cache_destroy(rt->kv);
    ml_sampler_destroy(rt->sampler);
    free(rt->step);
    free(rt->step_owner);
    free(rt->allowed);
    free(rt->logits);
    ml_json_vocab_destroy(rt->json_vocab);
    free(rt->json_allowed);
    free(rt);
}

/* Report a request refused at submit through its on_finish, as promised. */
static void refuse(const ml_request *req, ml_request_error error, const char *message)
{
    for (int i = 0; i < req->n_images; i++)
        free(req->images[i].pixels);
    ml_usage usage = {.prompt_tokens = req->n_prompt, .images = req->n_images};
    req->cb.on_finish(req->cb.ctx, NULL, 0, ML_FINISH_REASON_ERROR, error, message, &usage);
}

/* The request's adapter name, NULL for the base model. */
static const char *adapter_of(const ml_request *req)
{
    return req->adapter && req->adapter[0] ? req->adapter : NULL;
}

/* Check what can be known at submit. Returns ML_REQERR_NONE or the error,
 * with a message in msg. */
static ml_request_error validate(const ml_runtime *rt, const ml_request *req, char *msg,
                                 size_t n)
{
    const ml_config *mc = ml_model_config(rt->model);
    int image_tokens = 0;
    for (int i = 0; i < req->n_prompt; i++) {
        int32_t id = req->prompt[i];
        if (id < 0 || id >= mc->text.vocab_size + ML_MODEL_EMBED_EXTRA_ROWS) {
            ml_fail(msg, n, ML_ERR_INVALID_ARG, "prompt token %d at %d outside the vocabulary",
                    id, i);
            return ML_REQERR_INVALID_REQUEST;
        }
        image_tokens += id == mc->image_token_index;
    }
    if (req->n_prompt <= 0) {
        ml_fail(msg, n, ML_ERR_INVALID_ARG, "empty prompt");
        return ML_REQERR_INVALID_REQUEST;
    }
    if (image_tokens != req->n_images) {
        ml_fail(msg, n, ML_ERR_INVALID_ARG, "%d <|image|> tokens but %d images", image_tokens,
                req->n_images);
        return ML_REQERR_INVALID_REQUEST;
    }
    if (req->n_images > ml_model_limits_of(rt->model)->max_seq_images) {
        ml_fail(msg, n, ML_ERR_TOO_LARGE, "%d images, at most %d per request", req->n_images,
                ml_model_limits_of(rt->model)->max_seq_images);
        return ML_REQERR_INVALID_REQUEST;
    }
    const char *adapter = adapter_of(req);
    if (adapter && !rt->adapters) {
        ml_fail(msg, n, ML_ERR_NOT_FOUND, "adapter '%.64s': this worker serves no adapters",
                adapter);
        return ML_REQERR_UNKNOWN_ADAPTER;
    }
    if (adapter && !ml_adapters_known(rt->adapters, adapter)) {
        ml_fail(msg, n, ML_ERR_NOT_FOUND, "unknown adapter '%.64s'", adapter);
        return ML_REQERR_UNKNOWN_ADAPTER;
    }
    for (int i = 0; i < req->n_images; i++) {
        const ml_request_image *im = &req->images[i];
        /* With an adapter the key may still change (image_keys_for_adapter),
         * and the caller of an at_caller image wants to hear of its eviction
         * (ML_REQERR_IMAGE_EVICTED): a missing state is found at admission. */
        if (!im->pixels && !im->at_caller && !adapter &&
            !ml_image_cache_contains(rt->images, im->key)) {
            ml_fail(msg, n, ML_ERR_NOT_FOUND, "image %d is neither given nor resident", i);
            return ML_REQERR_INVALID_IMAGE;
        }
        if (im->n_tiles < 1 || im->n_tiles > rt->max_tiles) {
            ml_fail(msg, n, ML_ERR_INVALID_ARG, "image %d: %d tiles", i, im->n_tiles);
            return ML_REQERR_INVALID_IMAGE;
        }
    }
    /* The whole budget must hold the request's images at once, and the KV
     * pool its prompt plus one generated token. */
    if (req->n_images &&
        (size_t)req->n_images * ml_model_image_state_bytes(rt->model) > rt->cfg.image_bytes) {
        ml_fail(msg, n, ML_ERR_TOO_LARGE, "%d images need %zu MiB of resident state, budget %zu MiB",
                req->n_images, (size_t)req->n_images * ml_model_image_state_bytes(rt->model) >> 20,
                rt->cfg.image_bytes >> 20);
        return ML_REQERR_TOO_LARGE;
    }
    int need = req->n_prompt + 1;
    if (need > rt->context || (need + rt->block_size - 1) / rt->block_size >
                                  ml_kv_cache_n_blocks(rt->kv)) {
        ml_fail(msg, n, ML_ERR_TOO_LARGE,
                "prompt of %d tokens exceeds the context (%d tokens, KV pool %d tokens)",
                req->n_prompt, rt->context, ml_kv_cache_n_blocks(rt->kv) * rt->block_size);
        return ML_REQERR_CONTEXT_LENGTH;
    }
    return ML_REQERR_NONE;
}

/* JSON mode's shared parts, made once, at the first request that asks (the
 * token trie costs 100-200 ms and megabytes a worker without JSON requests
 * never needs). After a failure the next request tries again. */
static ml_status json_prepare(ml_runtime *rt, char *err, size_t errlen)
{
    if (rt->json_vocab)
        return ML_OK;
    if (!rt->json_allowed)
        rt->json_allowed = malloc(((size_t)rt->vocab + 63) / 64 * sizeof *rt->json_allowed);
    if (!rt->json_allowed)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "runtime: out of memory for JSON mode");
    return ml_json_vocab_create(rt->tok, (size_t)rt->vocab, &rt->json_vocab, err, errlen);
}

/* The request's stop strings are borrowed for the call only: keep a copy. */
static ml_status copy_stop_strings(rt_seq *s)
{
    size_t total = 1;
    for (size_t i = 0; i < s->sampling.n_stop; i++)
        total += s->sampling.stop_len[i];
    s->stop_text = malloc(total);
    if (!s->stop_text)
        return ML_ERR_NOMEM;
    char *p = s->stop_text;
    for (size_t i = 0; i < s->sampling.n_stop; i++) {
        memcpy(p, s->sampling.stop[i], s->sampling.stop_len[i]);
        s->sampling.stop[i] = p;
        p += s->sampling.stop_len[i];
    }
    return ML_OK;
}

ml_status ml_runtime_submit(ml_runtime *rt, const ml_request *req, uint64_t *handle, char *err,
                            size_t errlen)
{
    char msg[256];
    ml_request_error rerr = validate(rt, req, msg, sizeof msg);
    if (rerr == ML_REQERR_NONE &&
        ml_sampling_params_validate(&req->sampling, (size_t)rt->vocab, msg, sizeof msg) != ML_OK)
        rerr = ML_REQERR_INVALID_REQUEST;
    /* JSON mode's vocabulary, made at the first request that asks: should
     * that fail, this request ends saying why and the runtime goes on. */
    if (rerr == ML_REQERR_NONE && req->sampling.json_object &&
        json_prepare(rt, msg, sizeof msg) != ML_OK)
        rerr = ML_REQERR_INTERNAL;
    *handle = rt->next_handle++;
    if (rerr != ML_REQERR_NONE) {
        refuse(req, rerr, msg);
        return ML_OK;
    }

    rt_seq *s = calloc(1, sizeof *s);
    int cap = req->n_prompt + (int)req->sampling.max_tokens;
    if (cap > rt->context)
        cap = rt->context;
    if (!s)
        goto nomem;
    s->handle = *handle;
    s->cap = cap;
    s->n_prompt = s->n_tokens = req->n_prompt;
    s->tokens = malloc((size_t)cap * sizeof *s->tokens);
    s->blocks = malloc((size_t)rt->max_blocks * sizeof *s->blocks);
    s->n_images = req->n_images;
    size_t ni = (size_t)req->n_images + 1;
    s->images = calloc(ni, sizeof *s->images);
    s->entries = calloc(ni, sizeof *s->entries);
    s->states = calloc(ni, sizeof *s->states);
    s->range_start = calloc(ni, sizeof *s->range_start);
    s->range_end = calloc(ni, sizeof *s->range_end);
    if (!s->tokens || !s->blocks || !s->images || !s->entries || !s->states || !s->range_start ||
        !s->range_end)
        goto nomem;
    if (adapter_of(req) && !(s->adapter_name = strdup(adapter_of(req))))
        goto nomem;
    memcpy(s->tokens, req->prompt, (size_t)req->n_prompt * sizeof *s->tokens);
    if (req->n_images) /* a text-only request may pass no array at all */
        memcpy(s->images, req->images, (size_t)req->n_images * sizeof *s->images);
    s->sampling = req->sampling;
    if (s->sampling.json_object &&
        ml_json_state_create(rt->json_vocab, &s->json, err, errlen) != ML_OK)
        goto nomem;
    if (copy_stop_strings(s) != ML_OK ||
        ml_sampler_seq_create(&s->sampling, (size_t)rt->vocab, req->prompt,
                              (size_t)req->n_prompt, &s->sampler, err, errlen) != ML_OK ||
        ml_token_stream_create(rt->tok, ML_DECODE_SKIP_SPECIAL, &s->detok, err, errlen) != ML_OK ||
        ml_stop_create(s->sampling.stop, s->sampling.stop_len, s->sampling.n_stop, &s->stop, err,
                       errlen) != ML_OK)
        goto nomem;
    s->cb = req->cb;
    s->deadline_ms = req->deadline_ms;
    s->usage.prompt_tokens = req->n_prompt;
    s->usage.images = req->n_images;
    s->t_submit = now_ms();
    image_ranges(s, ml_model_config(rt->model)->image_token_index);
    s->state = SEQ_WAITING;
    ml_list_push_back(&rt->waiting, &s->link);
    return ML_OK;
nomem:
    if (s) {
        s->n_images = 0; /* pixels are freed below, once */
        seq_free(rt, s);
    }
    for (int i = 0; i < req->n_images; i++)
        free(req->images[i].pixels);
    return ml_fail(err, errlen, ML_ERR_NOMEM, "runtime: out of memory queueing a request");
}

static rt_seq *find_seq(ml_runtime *rt, uint64_t handle)
{
    for (rt_seq *s = seq_of(rt->running.head); s; s = seq_of(s->link.next))
        if (s->handle == handle)
            return s;
    for (rt_seq *s = seq_of(rt->waiting.head); s; s = seq_of(s->link.next))
        if (s->handle == handle)
            return s;
    return NULL;
}

void ml_runtime_cancel(ml_runtime *rt, uint64_t handle)
{
    rt_seq *s = find_seq(rt, handle);
    if (s)
        finish(rt, s, ML_FINISH_REASON_CANCELLED, ML_REQERR_NONE, "cancelled", 1);
}

/* ========================================================================== */
/* admission                                                                    */
/* ========================================================================== */

typedef enum acquire_result {
    ACQUIRE_DONE,
    ACQUIRE_WAIT,   /* no room now: retry at a later step */
    ACQUIRE_FAILED, /* the request cannot run: the error code and err say why */
} acquire_result;

/* The LoRA of s's adapter, NULL for the base model. */
static const ml_lora *seq_lora(const rt_seq *s)
{
    return s->adapter ? ml_adapter_lora(s->adapter) : NULL;
}

/* An adapter that changes image states gets its own states
 * (ml_image_key_for_adapter). */
static void image_keys_for_adapter(rt_seq *s)
{
    if (!ml_lora_touches_images(seq_lora(s)))
        return;
    const char *name = ml_adapter_name(s->adapter);
    for (int i = 0; i < s->n_images; i++)
        ml_image_key_for_adapter(s->images[i].key, name, s->images[i].key);
}

/* Reference s's adapter, loading it if needed (once per sequence: the
 * reference is kept through preemption). */
static acquire_result acquire_adapter(ml_runtime *rt, rt_seq *s, ml_request_error *error,
                                      char *err, size_t errlen)
{
    if (!s->adapter_name || s->adapter)
        return ACQUIRE_DONE;
    switch (ml_adapters_acquire(rt->adapters, s->adapter_name, &s->adapter, err, errlen)) {
    case ML_ADAPTER_READY:
        image_keys_for_adapter(s);
        return ACQUIRE_DONE;
    case ML_ADAPTER_BUSY:
        /* Every slot is referenced, and only admitted sequences hold
         * references: some run, and will release theirs. */
        assert(rt->running.n > 0);
        return ACQUIRE_WAIT;
    case ML_ADAPTER_UNKNOWN:
    case ML_ADAPTER_INVALID: break;
    }
    *error = ML_REQERR_UNKNOWN_ADAPTER;
    return ACQUIRE_FAILED;
}

/* Make every image of s resident (encoding misses, with s's adapter) and
 * hold a reference. On ACQUIRE_WAIT s keeps what it acquired. */
static acquire_result acquire_images(ml_runtime *rt, rt_seq *s, ml_request_error *error,
                                     char *err, size_t errlen)
{
    for (int i = 0; i < s->n_images; i++) {
        if (s->entries[i])
            continue;
        ml_request_image *im = &s->images[i];
        ml_image_entry *e = ml_image_cache_acquire(rt->images, im->key);
        if (e) {
            /* A request may name a resident image by key alone: its tile
             * count (for the cross-attention mask) is the state's. */
            im->n_tiles = ml_image_entry_n_tiles(e);
            s->usage.images_cached++;
            rt->stats.image_cache_hits++;
            free(im->pixels);
            im->pixels = NULL;
        } else {
            if (!im->pixels && im->at_caller) {
                ml_fail(err, errlen, ML_ERR_NOT_FOUND,
                        "image %d: its state was evicted since the caller saw it resident", i);
                *error = ML_REQERR_IMAGE_EVICTED;
                rt->stats.images_evicted++;
                return ACQUIRE_FAILED;
            }
            if (!im->pixels) {
                ml_fail(err, errlen, ML_ERR_NOT_FOUND, "image %d is neither given nor resident%s",
                        i, s->adapter_name ? " for this adapter" : "");
                *error = ML_REQERR_INVALID_IMAGE;
                return ACQUIRE_FAILED;
            }
            e = ml_image_cache_reserve(rt->images, im->key, im->n_tiles);
            if (!e)
                return ACQUIRE_WAIT;
            double t0 = now_ms();
            ml_status st = ml_model_encode_image(rt->model, im->pixels, im->aspect_ratio_id,
                                                 im->aspect_ratio_mask, seq_lora(s),
                                                 ml_image_entry_state(e), NULL, err, errlen);
            s->usage.vision_ms += now_ms() - t0;
            if (st != ML_OK) {
                ml_image_cache_release(rt->images, e);
                *error = ML_REQERR_INTERNAL;
                return ACQUIRE_FAILED;
            }
            ml_image_cache_publish(rt->images, e);
            rt->stats.images_encoded++;
            free(im->pixels);
            im->pixels = NULL;
        }
        s->entries[i] = e;
        s->states[i] = ml_image_entry_state(e);
    }
    return ACQUIRE_DONE;
}

/* Move waiting sequences into the running batch while there is room. */
static void admit(ml_runtime *rt)
{
    while (rt->waiting.head && rt->running.n < rt->cfg.max_running) {
        rt_seq *s = seq_of(rt->waiting.head);
        /* The first chunk's blocks must be free, or admission would only
         * cause a preemption. */
        int first = s->n_tokens - s->n_cached;
        if (first > rt->cfg.max_step_tokens)
            first = rt->cfg.max_step_tokens;
        if ((first + rt->block_size - 1) / rt->block_size > ml_kv_cache_n_free(rt->kv))
            return;
        if (s->t_admit == 0) {
            s->t_admit = now_ms();
            s->usage.queue_ms = s->t_admit - s->t_submit;
        }
        char err[256];
        ml_request_error error = ML_REQERR_NONE;
        acquire_result got = acquire_adapter(rt, s, &error, err, sizeof err);
        if (got == ACQUIRE_WAIT)
            return; /* FCFS: running sequences will release a slot */
        if (got == ACQUIRE_DONE)
            got = acquire_images(rt, s, &error, err, sizeof err);
        if (got == ACQUIRE_WAIT) {
            if (rt->running.n > 0)
                return; /* running sequences will release images */
            /* Nothing runs, so nothing will free image memory: the idle
             * resident entries are gone and still it does not fit. */
            finish(rt, s, ML_FINISH_REASON_ERROR, ML_REQERR_TOO_LARGE,
                   "the request's images do not fit the image budget", 0);
            continue;
        }
        if (got != ACQUIRE_DONE) {
            finish(rt, s, ML_FINISH_REASON_ERROR, error, err, 0);
            continue;
        }
        ml_list_remove(&rt->waiting, &s->link);
        s->state = SEQ_RUNNING;
        ml_list_push_back(&rt->running, &s->link);
    }
}

/* Preemption by recompute: s keeps its tokens (prompt and generated),
 * sampler and images, and re-prefills when readmitted, so its output does
 * not change. It goes to the front of the queue. */
static void preempt(ml_runtime *rt, rt_seq *s)
{
    release_blocks(rt, s);
    ml_list_remove(&rt->running, &s->link);
    s->state = SEQ_WAITING;
    s->usage.preemptions++;
    rt->stats.preemptions++;
    ml_list_push_front(&rt->waiting, &s->link);
}

typedef enum blocks_result {
    BLOCKS_OK,
    BLOCKS_PREEMPTED, /* s itself was the newest and went back to the queue */
    BLOCKS_NEVER,     /* s runs alone and the pool still cannot hold it */
} blocks_result;

/* Give s blocks for its first `upto` tokens, preempting the newest running
 * sequences (s included, when it is the newest) as needed. */
static blocks_result ensure_blocks(ml_runtime *rt, rt_seq *s, int upto)
{
    int need = (upto + rt->block_size - 1) / rt->block_size;
    while (s->n_blocks < need) {
        int32_t b = ml_kv_cache_alloc(rt->kv);
        if (b >= 0) {
            s->blocks[s->n_blocks++] = b;
            continue;
        }
        rt_seq *victim = seq_of(rt->running.tail);
        if (victim == s && rt->running.n == 1)
            return BLOCKS_NEVER;
        preempt(rt, victim);
        if (victim == s)
            return BLOCKS_PREEMPTED;
    }
    return BLOCKS_OK;
}

/* ========================================================================== */
/* the step                                                                     */
/* ========================================================================== */

static void expire(ml_runtime *rt)
{
    int64_t now = wall_ms();
    ml_list *lists[] = {&rt->running, &rt->waiting};
    for (int l = 0; l < 2; l++)
        for (rt_seq *s = seq_of(lists[l]->head), *next; s; s = next) {
            next = seq_of(s->link.next);
            if (s->deadline_ms && now >= s->deadline_ms)
                finish(rt, s, ML_FINISH_REASON_DEADLINE, ML_REQERR_NONE, "deadline exceeded", 1);
        }
}

/* Is s sampled on the host from its logits row (its logits callback must
 * see the row, or JSON mode masks it), rather than where the logits are
 * (ML_LOGITS_SAMPLE)? */
static bool samples_on_host(const rt_seq *s)
{
    return s->cb.on_logits != NULL || s->json != NULL;
}

/* Append the step's token to s and stream it: drawn here from `logits`, or
 * with logits NULL the model's s->sampled. */
static void advance(ml_runtime *rt, rt_seq *s, const float *logits)
{
    char err[256];
    ml_finish end = ML_FINISH_NONE;
    if (logits) {
        if (s->cb.on_logits)
            s->cb.on_logits(s->cb.ctx, logits, rt->vocab);
        /* JSON mode draws among the tokens its grammar allows next (the
         * object is incomplete here: a sequence ends as soon as its object
         * is, below). */
        const uint64_t *allowed = NULL;
        if (s->json) {
            ml_json_state_allowed(s->json, rt->json_allowed);
            allowed = rt->json_allowed;
        }
        if (ml_sampler_sample(rt->sampler, s->sampler, logits, allowed, &s->sampled, err,
                              sizeof err) != ML_OK) {
            finish(rt, s, ML_FINISH_REASON_ERROR, ML_REQERR_INTERNAL, err, 0);
            return;
        }
    } else if (s->sampled.chosen.id == ML_SAMPLE_NO_TOKEN) {
        finish(rt, s, ML_FINISH_REASON_ERROR, ML_REQERR_INTERNAL,
               "sampler: logits have no finite maximum", 0);
        return;
    }
    int32_t id = s->sampled.chosen.id;
    const ml_sample_out *lpp = s->sampling.logprobs ? &s->sampled : NULL;
    if (ml_sampler_seq_accept(s->sampler, id, &end, err, sizeof err) != ML_OK ||
        (s->json && ml_json_state_accept(s->json, id, err, sizeof err) != ML_OK)) {
        finish(rt, s, ML_FINISH_REASON_ERROR, ML_REQERR_INTERNAL, err, 0);
        return;
    }
    double t = now_ms();
    if (s->t_first == 0) {
        s->t_first = t;
        s->usage.ttft_ms = t - s->t_submit;
        s->usage.prefill_ms = t - s->t_admit - s->usage.vision_ms;
    }
    rt->stats.tokens_generated++;
    /* A stop token counts as generated but is not streamed. There is room:
     * it was sampled within max_tokens. */
    s->tokens[s->n_tokens++] = id;
    if (end == ML_FINISH_STOP) {
        finish(rt, s, ML_FINISH_REASON_STOP, ML_REQERR_NONE, NULL, 1);
        return;
    }
    const char *piece;
    size_t n;
    ml_stop_out r;
    if (ml_token_stream_push(s->detok, id, &piece, &n, err, sizeof err) != ML_OK ||
        ml_stop_feed(s->stop, piece, n, &r, err, sizeof err) != ML_OK) {
        finish(rt, s, ML_FINISH_REASON_ERROR, ML_REQERR_INTERNAL, err, 0);
        return;
    }
    s->cb.on_token(s->cb.ctx, id, r.text, r.len, lpp);
    if (r.stopped)
        finish(rt, s, ML_FINISH_REASON_STOP, ML_REQERR_NONE, NULL, 0);
    else if (s->json && ml_json_state_complete(s->json)) /* the object is the answer */
        finish(rt, s, ML_FINISH_REASON_STOP, ML_REQERR_NONE, NULL, 1);
    else if (end == ML_FINISH_LENGTH || s->n_tokens >= s->cap)
        finish(rt, s, ML_FINISH_REASON_LENGTH, ML_REQERR_NONE, NULL, 1);
}

/* Slot order of a step entry's adapter; the base model first. */
static int adapter_order(const rt_seq *s)
{
    return s->adapter ? ml_adapter_index(s->adapter) : -1;
}

/* Stable-sort the step by adapter, so each adapter's rows are one segment of
 * every LoRA op ("one pass per segment group"). A sequence's results do not
 * depend on its place in the step. */
static void group_by_adapter(ml_runtime *rt, int n_step)
{
    for (int i = 1; i < n_step; i++) {
        ml_step_seq q = rt->step[i];
        rt_seq *owner = rt->step_owner[i];
        int j = i;
        for (; j > 0 && adapter_order(rt->step_owner[j - 1]) > adapter_order(owner); j--) {
            rt->step[j] = rt->step[j - 1];
            rt->step_owner[j] = rt->step_owner[j - 1];
        }
        rt->step[j] = q;
        rt->step_owner[j] = owner;
    }
}

ml_status ml_runtime_step(ml_runtime *rt, char *err, size_t errlen)
{
    expire(rt);
    admit(rt);
    if (!rt->running.head)
        return ML_OK;

    /* Decode tokens first (oldest sequence first), then prefill chunks in
     * the remaining token budget. A sequence that gets no budget or no
     * blocks this step waits for the next. */
    int budget = rt->cfg.max_step_tokens, n_step = 0;
    size_t allowed_off = 0;
    for (int pass = 0; pass < 2; pass++) {
        rt_seq *s = seq_of(rt->running.head);
        while (s && budget > 0) {
            int pending = s->n_tokens - s->n_cached;
            int decoding = pending == 1 && s->n_tokens > s->n_prompt;
            if (pending <= 0 || decoding != (pass == 0)) {
                s = seq_of(s->link.next);
                continue;
            }
            int take = pending < budget ? pending : budget;
            /* Read the successor after ensure_blocks: preemption edits the
             * list, and only the tail (never s's predecessors) leaves it. */
            blocks_result br = ensure_blocks(rt, s, s->n_cached + take);
            rt_seq *next = br == BLOCKS_PREEMPTED ? NULL : seq_of(s->link.next);
            if (br == BLOCKS_NEVER) {
                finish(rt, s, ML_FINISH_REASON_LENGTH, ML_REQERR_NONE, NULL, 1);
                s = next;
                continue;
            }
            if (br == BLOCKS_PREEMPTED)
                break;
            ml_step_seq *q = &rt->step[n_step];
            q->tokens = s->tokens + s->n_cached;
            q->n_tokens = take;
            q->pos0 = s->n_cached;
            q->block_table = s->blocks;
            q->n_images = s->n_images;
            q->image_states = s->states;
            q->cross_allowed = NULL;
            if (s->n_images) {
                q->cross_allowed = rt->allowed + allowed_off;
                fill_allowed(rt, s, s->n_cached, take, rt->allowed + allowed_off);
                allowed_off += (size_t)take * s->n_images * rt->max_tiles;
            }
            q->logits = s->n_cached + take < s->n_tokens ? ML_LOGITS_NONE
                        : samples_on_host(s)            ? ML_LOGITS_LAST
                                                        : ML_LOGITS_SAMPLE;
            q->lora = seq_lora(s);
            rt->step_owner[n_step++] = s;
            budget -= take;
            s = next;
        }
    }
    /* A preemption above may have removed a sequence already placed in the
     * step; such a sequence no longer owns its blocks. Drop it. */
    int kept = 0;
    for (int i = 0; i < n_step; i++) {
        if (rt->step_owner[i]->state != SEQ_RUNNING)
            continue;
        rt->step[kept] = rt->step[i];
        rt->step_owner[kept++] = rt->step_owner[i];
    }
    n_step = kept;
    if (n_step == 0)
        return ML_OK;
    /* Only now draw: a sequence dropped above must not have consumed a
     * number of its stream. */
    for (int i = 0; i < n_step; i++) {
        ml_step_seq *q = &rt->step[i];
        rt_seq *s = rt->step_owner[i];
        if (q->logits != ML_LOGITS_SAMPLE)
            continue;
        ml_sampler_seq_row(s->sampler, &s->row, &q->pen_id, &q->pen_count);
        q->sample = &s->row;
        q->sampled = &s->sampled;
    }
    group_by_adapter(rt, n_step);

    ml_status st = ml_model_forward(rt->model, rt->kv, rt->step, n_step, rt->logits, NULL, err,
                                    errlen);
    if (st != ML_OK)
        return st;
    rt->stats.steps++;
    int row = 0;
    for (int i = 0; i < n_step; i++) {
        rt_seq *s = rt->step_owner[i];
        s->n_cached += rt->step[i].n_tokens;
        if (rt->step[i].logits == ML_LOGITS_SAMPLE)
            advance(rt, s, NULL);
        else if (rt->step[i].logits == ML_LOGITS_LAST)
            advance(rt, s, rt->logits + (size_t)row++ * rt->vocab);
    }
    return ML_OK;
}

/* ========================================================================== */
/* queries                                                                      */
/* ========================================================================== */

int ml_runtime_active(const ml_runtime *rt) { return rt->waiting.n + rt->running.n; }
int ml_runtime_running(const ml_runtime *rt) { return rt->running.n; }
ml_image_cache *ml_runtime_image_cache(ml_runtime *rt) { return rt->images; }

void ml_runtime_get_stats(const ml_runtime *rt, ml_runtime_stats *st)
{
    *st = rt->stats;
    st->waiting = rt->waiting.n;
    st->running = rt->running.n;
    st->kv_blocks_total = ml_kv_cache_n_blocks(rt->kv);
    st->kv_blocks_free = ml_kv_cache_n_free(rt->kv);
    st->image_bytes_used = ml_image_cache_used(rt->images);
    st->image_bytes_budget = ml_image_cache_budget(rt->images);
    if (rt->adapters)
        ml_adapters_get_stats(rt->adapters, &st->adapters);
}
