/* The step (runtime.h): deadlines, FCFS admission of what the adapter
 * slots, the image budget and the K/V pool allow, preemption by recompute
 * when blocks run out, and one forward pass that mixes decode tokens with
 * chunked prefill. What happens to a sequence's tokens is sequence.c. */
#include <assert.h>
#include <stdbool.h>
#include <stdlib.h>

#include "runtime/runtime_internal.h"

/* ---- admission ------------------------------------------------------------- */

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

/* An adapter that changes image states gets its own states, keyed from
 * the request's content digests by the adapter derivation
 * (ml_image_state_key). */
static void image_keys_for_adapter(rt_seq *s)
{
    if (!ml_lora_touches_images(seq_lora(s)))
        return;
    const char *name = ml_adapter_name(s->adapter);
    for (int i = 0; i < s->n_images; i++)
        ml_image_state_key(s->salt, s->content[i], name, s->images[i].key);
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
            double t0 = ml_clock_ms();
            ml_status st = ml_model_encode_image(rt->model, im->pixels, im->aspect_ratio_id,
                                                 im->aspect_ratio_mask, seq_lora(s),
                                                 ml_image_entry_state(e), NULL, err, errlen);
            s->usage.vision_ms += ml_clock_ms() - t0;
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

/* Blocks that hold n tokens. */
static int blocks_for(const ml_runtime *rt, int n)
{
    return (n + rt->block_size - 1) / rt->block_size;
}

/* Tokens of s's next prefill chunk. */
static int first_chunk(const ml_runtime *rt, const rt_seq *s)
{
    int first = s->n_tokens - s->n_cached;
    return first < rt->cfg.max_step_tokens ? first : rt->cfg.max_step_tokens;
}

/* Batch slots the running sequences take, with the choices they will fork. */
static int slots_used(const ml_runtime *rt)
{
    int used = 0;
    for (const rt_seq *s = seq_of(rt->running.head); s; s = seq_of(s->link.next))
        used += ml_rt_seq_slots(s);
    return used;
}

/* Move waiting sequences into the running batch while there is room: a
 * request of n choices takes n slots at once (its forks join the batch
 * when its prompt is prefilled, ml_rt_seq_fork). */
static void admit(ml_runtime *rt)
{
    while (rt->waiting.head &&
           slots_used(rt) + ml_rt_seq_slots(seq_of(rt->waiting.head)) <= rt->cfg.max_running) {
        rt_seq *s = seq_of(rt->waiting.head);
        /* The first chunk's blocks must be free, or admission would only
         * cause a preemption. Cached blocks are not looked up yet (the keys
         * may still change with the adapter): this bound assumes none. */
        if (blocks_for(rt, first_chunk(rt, s)) > ml_kv_cache_n_free(rt->kv))
            return;
        if (s->t_admit == 0) {
            s->t_admit = ml_clock_ms();
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
            ml_rt_seq_finish(rt, s, ML_FINISH_REASON_ERROR, ML_REQERR_TOO_LARGE,
                             "the request's images do not fit the image budget", 0);
            continue;
        }
        if (got != ACQUIRE_DONE) {
            ml_rt_seq_finish(rt, s, ML_FINISH_REASON_ERROR, error, err, 0);
            continue;
        }
        /* Cached blocks by reference; what is left must still find room
         * (counting idle cached blocks as free), or it waits holding none.
         * With nothing running everything idle is free: it fits, as submit
         * checked. */
        int hit = ml_rt_prefix_match(rt, s);
        if (rt->running.n > 0 && blocks_for(rt, first_chunk(rt, s)) > ml_kv_cache_n_free(rt->kv)) {
            ml_rt_seq_release_blocks(rt, s);
            return;
        }
        int eligible = rt->cfg.prefix_cache ? (s->n_tokens - 1) / rt->block_size : 0;
        rt->stats.prefix_block_hits += (uint64_t)s->n_blocks;
        rt->stats.prefix_block_misses += (uint64_t)(eligible - s->n_blocks);
        if (s->usage.preemptions == 0) /* what the request's own prefill was spared */
            s->usage.prompt_tokens_cached = hit;
        ml_list_remove(&rt->waiting, &s->link);
        s->state = SEQ_RUNNING;
        ml_list_push_back(&rt->running, &s->link);
    }
}

/* ---- K/V blocks and preemption --------------------------------------------- */

/* Preemption by recompute: s keeps its tokens (prompt and generated),
 * sampler and images, and re-prefills when readmitted, so its output does
 * not change; with the prefix cache its published blocks stay cached
 * (idle, evictable) and those still there when it returns are not
 * recomputed. It goes to the front of the queue. */
static void preempt(ml_runtime *rt, rt_seq *s)
{
    ml_rt_seq_release_blocks(rt, s);
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
    BLOCKS_FAILED,    /* copying a shared block failed: err says why */
} blocks_result;

/* Give s blocks for its first `upto` tokens, preempting the newest running
 * sequences (s included, when it is the newest) as needed. The block its
 * next token goes into, partly filled and shared with another choice of
 * its request (ml_rt_seq_fork), is copied first: copy-on-write. */
static blocks_result ensure_blocks(ml_runtime *rt, rt_seq *s, int upto, char *err,
                                   size_t errlen)
{
    int need = blocks_for(rt, upto);
    int into = s->n_cached / rt->block_size;
    bool cow = s->n_cached % rt->block_size && ml_kv_cache_shared(rt->kv, s->blocks[into]);
    while (s->n_blocks < need || cow) {
        int32_t b = ml_kv_cache_alloc(rt->kv);
        if (b >= 0 && cow) {
            if (ml_kv_cache_copy_block(rt->kv, b, s->blocks[into], err, errlen) != ML_OK) {
                ml_kv_cache_release(rt->kv, b);
                return BLOCKS_FAILED;
            }
            ml_kv_cache_release(rt->kv, s->blocks[into]);
            s->blocks[into] = b;
            cow = false;
            continue;
        }
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

/* ---- the step -------------------------------------------------------------- */

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void expire(ml_runtime *rt)
{
    int64_t now = wall_ms();
    ml_list *lists[] = {&rt->running, &rt->waiting};
    for (int l = 0; l < 2; l++)
        for (rt_seq *s = seq_of(lists[l]->head), *next; s; s = next) {
            next = seq_of(s->link.next);
            if (s->deadline_ms && now >= s->deadline_ms)
                ml_rt_seq_finish(rt, s, ML_FINISH_REASON_DEADLINE, ML_REQERR_NONE,
                                 "deadline exceeded", 1);
        }
}

/* Is s sampled on the host from its logits row (its logits callback must
 * see the row, or its request's other choices draw from it too:
 * ml_rt_seq_fork), rather than where the logits are (ML_LOGITS_SAMPLE)?
 * Otherwise a constrained row is sampled where the logits are, its mask
 * with it. */
static bool samples_on_host(const rt_seq *s)
{
    return s->cb.on_logits != NULL || s->n_forks > 0;
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

/* Is computing s's tokens from pos on a decode step (its one new token),
 * rather than a prefill chunk (the prompt, or a recompute)? */
static bool is_decode(const rt_seq *s, int pos)
{
    return s->n_tokens - pos == 1 && s->n_tokens > s->n_prompt;
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
            int decoding = is_decode(s, s->n_cached);
            if (pending <= 0 || decoding != (pass == 0)) {
                s = seq_of(s->link.next);
                continue;
            }
            int take = pending < budget ? pending : budget;
            /* Read the successor after ensure_blocks: preemption edits the
             * list, and only the tail (never s's predecessors) leaves it. */
            char why[256];
            blocks_result br = ensure_blocks(rt, s, s->n_cached + take, why, sizeof why);
            rt_seq *next = br == BLOCKS_PREEMPTED ? NULL : seq_of(s->link.next);
            if (br == BLOCKS_NEVER) {
                ml_rt_seq_finish(rt, s, ML_FINISH_REASON_LENGTH, ML_REQERR_NONE, NULL, 1);
                s = next;
                continue;
            }
            if (br == BLOCKS_FAILED) {
                /* Out of memory: this request. A backend error is latched
                 * too and ends the step (process-level). */
                ml_rt_seq_finish(rt, s, ML_FINISH_REASON_ERROR, ML_REQERR_INTERNAL, why, 0);
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
                ml_rt_seq_fill_allowed(rt, s, s->n_cached, take, rt->allowed + allowed_off);
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
     * number of its stream. A constrained sequence's mask for this token
     * goes to the mask thread, which computes it while the forward pass
     * runs; the model waits for it before its sample op. */
    for (int i = 0; i < n_step; i++) {
        ml_step_seq *q = &rt->step[i];
        rt_seq *s = rt->step_owner[i];
        q->mask = NULL;
        q->mask_wait = NULL;
        q->mask_ctx = NULL;
        if (q->logits == ML_LOGITS_NONE)
            continue;
        if (s->con)
            ml_masker_queue(rt->masker, s->con);
        for (int k = 0; k < s->n_forks; k++) /* they draw from this row too */
            if (s->forks[k]->con)
                ml_masker_queue(rt->masker, s->forks[k]->con);
        if (q->logits != ML_LOGITS_SAMPLE)
            continue;
        ml_sampler_seq_row(s->sampler, &s->row, &q->pen_id, &q->pen_count, &q->bias);
        q->sample = &s->row;
        q->sampled = &s->sampled;
        if (s->con) {
            q->mask = ml_constraint_mask(s->con);
            q->mask_wait = ml_constraint_wait;
            q->mask_ctx = s->con;
        }
    }
    group_by_adapter(rt, n_step);

    ml_status st = ml_model_forward(rt->model, rt->kv, rt->step, n_step, rt->logits, NULL, err,
                                    errlen);
    /* Every mask of the step is ready before a token is accepted, or a
     * sequence ends (nothing is in flight between steps). */
    if (rt->masker)
        ml_masker_drain(rt->masker);
    if (st != ML_OK)
        return st;
    rt->stats.steps++;
    int row = 0;
    for (int i = 0; i < n_step; i++) {
        rt_seq *s = rt->step_owner[i];
        if (!is_decode(s, rt->step[i].pos0))
            rt->stats.prefill_tokens += (uint64_t)rt->step[i].n_tokens;
        s->n_cached += rt->step[i].n_tokens;
        ml_rt_prefix_publish(rt, s); /* before advance, which may end s */
        if (rt->step[i].logits == ML_LOGITS_SAMPLE)
            ml_rt_seq_advance(rt, s, NULL);
        else if (rt->step[i].logits == ML_LOGITS_LAST && s->n_forks)
            ml_rt_seq_fork(rt, s, rt->logits + (size_t)row++ * rt->vocab);
        else if (rt->step[i].logits == ML_LOGITS_LAST)
            ml_rt_seq_advance(rt, s, rt->logits + (size_t)row++ * rt->vocab);
    }
    return ML_OK;
}
