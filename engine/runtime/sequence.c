/* A sequence's life (runtime.h): submit checks a request and queues it,
 * its cross-attention rows follow from its <|image|> tokens, each token the
 * step samples is streamed through its stop strings, and cancel, a stop, an
 * error or the end of its budget finish it, releasing everything at once.
 * The step that schedules it is scheduler.c. */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime_internal.h"

/* ---- memory ---------------------------------------------------------------- */

void ml_rt_seq_release_blocks(ml_runtime *rt, rt_seq *s)
{
    /* Last block first: cached blocks become idle most recently used in
     * reverse, so eviction takes a prefix's tail before its head (a block
     * is found only through its parents). */
    for (int i = s->n_blocks - 1; i >= 0; i--)
        ml_kv_cache_release(rt->kv, s->blocks[i]);
    s->n_blocks = 0;
    s->n_cached = 0;
    s->n_published = 0;
}

static void seq_free(ml_runtime *rt, rt_seq *s)
{
    for (int i = 0; i < s->n_forks; i++)
        seq_free(rt, s->forks[i]);
    free(s->forks);
    ml_rt_seq_release_blocks(rt, s);
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
    free(s->content);
    free(s->entries);
    free(s->states);
    free(s->range_start);
    free(s->range_end);
    free(s->tokens);
    free(s->blocks);
    free(s->chain);
    free(s->stop_text);
    ml_sampler_seq_destroy(s->sampler);
    ml_constraint_destroy(s->con);
    ml_token_stream_destroy(s->detok);
    ml_stop_destroy(s->stop);
    free(s);
}

/* ---- cross-attention mask -------------------------------------------------- */

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

void ml_rt_seq_fill_allowed(const ml_runtime *rt, const rt_seq *s, int pos, int n, uint8_t *out)
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

/* ---- submit / cancel ------------------------------------------------------- */

/* The request's choices: n, or 1 when it asks for one or gives no
 * callbacks for more (validate refuses that). */
static int n_choices(const ml_request *req)
{
    return req->n > 1 && req->choices ? req->n : 1;
}

/* The callbacks of choice i. */
static const ml_request_callbacks *choice_cb(const ml_request *req, int i)
{
    return req->n > 1 && req->choices ? &req->choices[i] : &req->cb;
}

/* Report a request refused at submit through the on_finish of each of its
 * choices, as promised. */
static void refuse(const ml_request *req, ml_request_error error, const char *message)
{
    for (int i = 0; i < req->n_images; i++)
        free(req->images[i].pixels);
    ml_usage usage = {.prompt_tokens = req->n_prompt, .images = req->n_images};
    for (int i = 0; i < n_choices(req); i++) {
        const ml_request_callbacks *cb = choice_cb(req, i);
        cb->on_finish(cb->ctx, NULL, 0, ML_FINISH_REASON_ERROR, error, message, &usage);
    }
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
    if (req->n < 0 || (req->n > 1 && !req->choices)) {
        ml_fail(msg, n, ML_ERR_INVALID_ARG, "n %d: %s", req->n,
                req->n < 0 ? "negative" : "choices without their callbacks");
        return ML_REQERR_INVALID_REQUEST;
    }
    if (req->n > rt->cfg.max_running) {
        ml_fail(msg, n, ML_ERR_TOO_LARGE,
                "n %d: more choices than the batch runs at once (runtime.max_running %d)",
                req->n, rt->cfg.max_running);
        return ML_REQERR_INVALID_REQUEST;
    }
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
        if (!im->pixels && !im->at_caller && !adapter) {
            uint8_t key[ML_IMAGE_KEY_BYTES];
            ml_image_state_key(req->cache_salt, im->key, NULL, key);
            if (!ml_image_cache_contains(rt->images, key)) {
                ml_fail(msg, n, ML_ERR_NOT_FOUND, "image %d is neither given nor resident", i);
                return ML_REQERR_INVALID_IMAGE;
            }
        }
        if (im->n_tiles < 1 || im->n_tiles > rt->max_tiles) {
            ml_fail(msg, n, ML_ERR_INVALID_ARG, "image %d: %d tiles", i, im->n_tiles);
            return ML_REQERR_INVALID_IMAGE;
        }
        /* The encode computes the cross K/V of the tiles the mask flags
         * (ml_model_encode_image) and the rows see the first n_tiles: they
         * must be the same tiles, as the image processor makes them. */
        for (int t = 0; im->pixels && t < rt->max_tiles; t++)
            if ((im->aspect_ratio_mask[t] != 0) != (t < im->n_tiles)) {
                ml_fail(msg, n, ML_ERR_INVALID_ARG,
                        "image %d: its aspect ratio mask does not mark its first %d tiles", i,
                        im->n_tiles);
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

/* Structured outputs' shared parts, made once, at the first request that
 * asks (the token trie costs 100-200 ms and megabytes, the mask thread a
 * thread, that a worker without such requests never needs). After a
 * failure the next request tries again. */
static ml_status constraint_prepare(ml_runtime *rt, char *err, size_t errlen)
{
    ml_status st = ML_OK;
    if (!rt->masker)
        st = ml_masker_create(rt->cfg.max_running, &rt->masker, err, errlen);
    if (st == ML_OK && !rt->json_vocab)
        st = ml_json_vocab_create(rt->tok, (size_t)rt->vocab, &rt->json_vocab, err, errlen);
    return st;
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

/* The sequence of choice `choice` of req, sampling with seed
 * req->sampling.seed + choice (runtime.h ml_request.n). Choice 0 takes the
 * images' pixels; the others hold none (they take choice 0's states when
 * forked, ml_rt_seq_fork). On error nothing is taken: the pixels are
 * still the caller's. */
static ml_status seq_create(ml_runtime *rt, const ml_request *req, int choice, uint64_t handle,
                            rt_seq **out, char *err, size_t errlen)
{
    rt_seq *s = calloc(1, sizeof *s);
    int cap = req->n_prompt + (int)req->sampling.max_tokens;
    if (cap > rt->context)
        cap = rt->context;
    if (!s)
        return ML_ERR_NOMEM;
    s->handle = handle;
    s->cap = cap;
    s->n_prompt = s->n_tokens = req->n_prompt;
    s->tokens = malloc((size_t)cap * sizeof *s->tokens);
    s->blocks = malloc((size_t)rt->max_blocks * sizeof *s->blocks);
    s->chain = malloc(((size_t)cap / rt->block_size + 1) * ML_KV_BLOCK_HASH_BYTES);
    s->n_images = req->n_images;
    size_t ni = (size_t)req->n_images + 1;
    s->images = calloc(ni, sizeof *s->images);
    s->content = calloc(ni, sizeof *s->content);
    s->entries = calloc(ni, sizeof *s->entries);
    s->states = calloc(ni, sizeof *s->states);
    s->range_start = calloc(ni, sizeof *s->range_start);
    s->range_end = calloc(ni, sizeof *s->range_end);
    if (!s->tokens || !s->blocks || !s->chain || !s->images || !s->content || !s->entries ||
        !s->states || !s->range_start || !s->range_end)
        goto nomem;
    if (adapter_of(req) && !(s->adapter_name = strdup(adapter_of(req))))
        goto nomem;
    memcpy(s->tokens, req->prompt, (size_t)req->n_prompt * sizeof *s->tokens);
    if (req->n_images) /* a text-only request may pass no array at all */
        memcpy(s->images, req->images, (size_t)req->n_images * sizeof *s->images);
    /* Base keys until an adapter that changes images is acquired
     * (scheduler.c image_keys_for_adapter). */
    memcpy(s->salt, req->cache_salt, sizeof s->salt);
    for (int i = 0; i < req->n_images; i++) {
        if (choice > 0)
            s->images[i].pixels = NULL;
        memcpy(s->content[i], req->images[i].key, ML_IMAGE_KEY_BYTES);
        ml_image_state_key(s->salt, s->content[i], NULL, s->images[i].key);
    }
    s->sampling = req->sampling;
    s->sampling.seed = req->sampling.seed + (uint64_t)choice; /* wraps: any seed has n streams */
    /* The grammar is the caller's: the constraint holds its own reference
     * (and the course of a grammar_on_brace answer). */
    s->sampling.grammar = NULL;
    s->sampling.grammar_on_brace = false;
    if (ml_constraint_wanted(&req->sampling) &&
        ml_constraint_create(&req->sampling, rt->json_vocab, &s->con, err, errlen) != ML_OK)
        goto nomem;
    if (copy_stop_strings(s) != ML_OK ||
        ml_sampler_seq_create(&s->sampling, (size_t)rt->vocab, req->prompt,
                              (size_t)req->n_prompt, &s->sampler, err, errlen) != ML_OK ||
        ml_token_stream_create(rt->tok, ML_DECODE_SKIP_SPECIAL, &s->detok, err, errlen) != ML_OK ||
        ml_stop_create(s->sampling.stop, s->sampling.stop_len, s->sampling.n_stop, &s->stop, err,
                       errlen) != ML_OK)
        goto nomem;
    /* The bias entries were borrowed for the call: the sampler keeps its copy. */
    s->sampling.logit_bias = NULL;
    s->sampling.n_logit_bias = 0;
    s->cb = *choice_cb(req, choice);
    s->deadline_ms = req->deadline_ms;
    s->usage.prompt_tokens = req->n_prompt;
    s->usage.images = req->n_images;
    s->t_submit = ml_clock_ms();
    image_ranges(s, ml_model_config(rt->model)->image_token_index);
    *out = s;
    return ML_OK;
nomem:
    s->n_images = 0; /* the pixels stay the caller's */
    seq_free(rt, s);
    return ML_ERR_NOMEM;
}

ml_status ml_runtime_submit(ml_runtime *rt, const ml_request *req, uint64_t *handle, char *err,
                            size_t errlen)
{
    char msg[256];
    ml_request_error rerr = validate(rt, req, msg, sizeof msg);
    if (rerr == ML_REQERR_NONE &&
        ml_sampling_params_validate(&req->sampling, (size_t)rt->vocab, msg, sizeof msg) != ML_OK)
        rerr = ML_REQERR_INVALID_REQUEST;
    /* Structured outputs' trie and thread, made at the first request that
     * asks: should that fail, this request ends saying why and the runtime
     * goes on. */
    if (rerr == ML_REQERR_NONE && req->sampling.json_object && req->sampling.grammar) {
        ml_fail(msg, sizeof msg, ML_ERR_INVALID_ARG, "json_object and a grammar exclude each other");
        rerr = ML_REQERR_INVALID_REQUEST;
    }
    if (rerr == ML_REQERR_NONE && ml_constraint_wanted(&req->sampling) &&
        constraint_prepare(rt, msg, sizeof msg) != ML_OK)
        rerr = ML_REQERR_INTERNAL;
    *handle = rt->next_handle++;
    if (rerr != ML_REQERR_NONE) {
        refuse(req, rerr, msg);
        return ML_OK;
    }
    /* The other choices first, holding no pixels, then choice 0, which
     * takes them: on a failure the pixels are still all the caller's. */
    int n = n_choices(req);
    rt_seq *s = NULL, **forks = n > 1 ? calloc((size_t)n - 1, sizeof *forks) : NULL;
    ml_status st = n > 1 && !forks ? ML_ERR_NOMEM : ML_OK;
    for (int i = 1; st == ML_OK && i < n; i++)
        st = seq_create(rt, req, i, *handle, &forks[i - 1], err, errlen);
    if (st == ML_OK)
        st = seq_create(rt, req, 0, *handle, &s, err, errlen);
    if (st != ML_OK) {
        for (int i = 0; forks && i < n - 1; i++)
            if (forks[i])
                seq_free(rt, forks[i]);
        free(forks);
        for (int i = 0; i < req->n_images; i++)
            free(req->images[i].pixels);
        return ml_fail(err, errlen, ML_ERR_NOMEM, "runtime: out of memory queueing a request");
    }
    for (int i = 0; i < n - 1; i++)
        forks[i]->state = SEQ_UNFORKED;
    s->forks = forks;
    s->n_forks = n - 1;
    rt->n_unforked += n - 1;
    s->state = SEQ_WAITING;
    ml_list_push_back(&rt->waiting, &s->link);
    return ML_OK;
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
    /* Every choice of the request: they share its handle (and those not
     * forked yet end with choice 0). */
    for (rt_seq *s; (s = find_seq(rt, handle));)
        ml_rt_seq_finish(rt, s, ML_FINISH_REASON_CANCELLED, ML_REQERR_NONE, "cancelled", 1);
}

/* ---- choices --------------------------------------------------------------- */

void ml_rt_seq_fork(ml_runtime *rt, rt_seq *s, const float *logits)
{
    /* Every block of the prompt by reference, the last one too when the
     * prompt ends inside it: whichever choice then writes into it first
     * copies it (scheduler.c ensure_blocks), the full ones nobody writes. */
    assert(s->n_cached == s->n_prompt);
    rt_seq **forks = s->forks;
    int n_forks = s->n_forks;
    s->forks = NULL;
    s->n_forks = 0;
    for (int i = 0; i < n_forks; i++) {
        rt_seq *f = forks[i];
        for (int k = 0; k < s->n_images; k++) {
            /* s holds the state (its key is final: adapter applied). */
            memcpy(f->images[k].key, s->images[k].key, ML_IMAGE_KEY_BYTES);
            f->images[k].n_tiles = s->images[k].n_tiles;
            f->entries[k] = ml_image_cache_acquire(rt->images, f->images[k].key);
            assert(f->entries[k]);
            f->states[k] = ml_image_entry_state(f->entries[k]);
        }
        if (s->adapter) {
            char err[256];
            ml_adapter_result got =
                ml_adapters_acquire(rt->adapters, s->adapter_name, &f->adapter, err, sizeof err);
            assert(got == ML_ADAPTER_READY); /* resident: s references it */
        }
        for (int b = 0; b < s->n_blocks; b++) {
            ml_kv_cache_retain(rt->kv, s->blocks[b]);
            f->blocks[b] = s->blocks[b];
        }
        f->n_blocks = s->n_blocks;
        f->n_published = s->n_published; /* published by s, when they were */
        f->n_cached = s->n_cached;
        if (s->rooted) {
            memcpy(f->root, s->root, sizeof f->root);
            f->rooted = 1;
        }
        /* The request's prompt, images and queue, as choice 0 saw them. */
        f->usage.queue_ms = s->usage.queue_ms;
        f->usage.vision_ms = s->usage.vision_ms;
        f->usage.images_cached = s->usage.images_cached;
        f->usage.prompt_tokens_cached = s->usage.prompt_tokens_cached;
        f->t_admit = s->t_admit;
        f->state = SEQ_RUNNING;
        ml_list_push_back(&rt->running, &f->link);
        rt->n_unforked--;
        rt->stats.choices_forked++;
    }
    /* Each draws its first token from the same logits, choice 0 first; any
     * may end at once (s too: the forks hold their own references). */
    ml_rt_seq_advance(rt, s, logits);
    for (int i = 0; i < n_forks; i++)
        ml_rt_seq_advance(rt, forks[i], logits);
    free(forks);
}

/* ---- a sampled token ------------------------------------------------------- */

void ml_rt_seq_advance(ml_runtime *rt, rt_seq *s, const float *logits)
{
    char err[256];
    ml_finish end = ML_FINISH_NONE;
    if (logits) {
        if (s->cb.on_logits)
            s->cb.on_logits(s->cb.ctx, logits, rt->vocab);
        const uint64_t *allowed = s->con ? ml_constraint_mask(s->con) : NULL;
        if (ml_sampler_sample(rt->sampler, s->sampler, logits, allowed, &s->sampled, err,
                              sizeof err) != ML_OK) {
            ml_rt_seq_finish(rt, s, ML_FINISH_REASON_ERROR, ML_REQERR_INTERNAL, err, 0);
            return;
        }
    } else if (s->sampled.chosen.id == ML_SAMPLE_NO_TOKEN) {
        ml_rt_seq_finish(rt, s, ML_FINISH_REASON_ERROR, ML_REQERR_INTERNAL,
                         "sampler: logits have no finite maximum", 0);
        return;
    }
    int32_t id = s->sampled.chosen.id;
    const ml_sample_out *lpp = s->sampling.logprobs ? &s->sampled : NULL;
    if (ml_sampler_seq_accept(s->sampler, id, &end, err, sizeof err) != ML_OK ||
        (s->con && end != ML_FINISH_STOP &&
         ml_constraint_accept(s->con, id, err, sizeof err) != ML_OK)) {
        ml_rt_seq_finish(rt, s, ML_FINISH_REASON_ERROR, ML_REQERR_INTERNAL, err, 0);
        return;
    }
    double t = ml_clock_ms();
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
        ml_rt_seq_finish(rt, s, ML_FINISH_REASON_STOP, ML_REQERR_NONE, NULL, 1);
        return;
    }
    const char *piece;
    size_t n;
    ml_stop_out r;
    if (ml_token_stream_push(s->detok, id, &piece, &n, err, sizeof err) != ML_OK ||
        ml_stop_feed(s->stop, piece, n, &r, err, sizeof err) != ML_OK) {
        ml_rt_seq_finish(rt, s, ML_FINISH_REASON_ERROR, ML_REQERR_INTERNAL, err, 0);
        return;
    }
    s->cb.on_token(s->cb.ctx, id, r.text, r.len, lpp);
    if (r.stopped)
        ml_rt_seq_finish(rt, s, ML_FINISH_REASON_STOP, ML_REQERR_NONE, NULL, 0);
    else if (s->con && ml_constraint_ended(s->con)) /* the document is the answer */
        ml_rt_seq_finish(rt, s, ML_FINISH_REASON_STOP, ML_REQERR_NONE, NULL, 1);
    else if (end == ML_FINISH_LENGTH || s->n_tokens >= s->cap)
        ml_rt_seq_finish(rt, s, ML_FINISH_REASON_LENGTH, ML_REQERR_NONE, NULL, 1);
}

/* ---- the end --------------------------------------------------------------- */

void ml_rt_seq_finish(ml_runtime *rt, rt_seq *s, ml_finish_reason reason, ml_request_error error,
                      const char *message, int emit_tail)
{
    if (s->state == SEQ_UNFORKED)
        rt->n_unforked--;
    else
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
    double t = ml_clock_ms();
    if (s->t_first > 0)
        s->usage.decode_ms = t - s->t_first;
    s->usage.completion_tokens = s->n_tokens - s->n_prompt;
    ml_request_callbacks cb = s->cb;
    ml_usage usage = s->usage;
    rt_seq **forks = s->forks;
    int n_forks = s->n_forks;
    s->forks = NULL;
    s->n_forks = 0;
    /* Free first, so the callback sees the memory already returned. */
    seq_free(rt, s);
    cb.on_finish(cb.ctx, tail, tail_len, reason, error, message, &usage);
    /* Choices not forked yet end as their request did, with nothing
     * generated. */
    for (int i = 0; i < n_forks; i++)
        ml_rt_seq_finish(rt, forks[i], reason, error, message, 0);
    free(forks);
}
