/* The step thread: owns the runtime, holds prepared jobs until the runtime
 * has room and admits them across tenants by weight (fair.h), applies
 * cancels, steps the batch and turns the runtime's callbacks into reply
 * records. It decodes no image (a late one goes back to the prep pool:
 * on_finish).
 * @locality: the step thread (callbacks included). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "metrics.h"
#include "worker/worker_internal.h"

#define IDLE_WAIT_MS 50
#define PARKED_WAIT_MS 2 /* how often parked jobs are looked at when nothing runs */

static svc_finish finish_of(ml_finish_reason r)
{
    switch (r) {
    case ML_FINISH_REASON_STOP: return SVC_FINISH_STOP;
    case ML_FINISH_REASON_LENGTH: return SVC_FINISH_LENGTH;
    case ML_FINISH_REASON_CANCELLED: return SVC_FINISH_CANCELLED;
    case ML_FINISH_REASON_DEADLINE:
    case ML_FINISH_REASON_ERROR: return SVC_FINISH_ERROR;
    }
    return SVC_FINISH_ERROR;
}

static svc_error error_of(ml_request_error e)
{
    switch (e) {
    case ML_REQERR_NONE: return SVC_ERROR_NONE;
    case ML_REQERR_INVALID_REQUEST: return SVC_ERROR_INVALID_REQUEST;
    case ML_REQERR_INVALID_IMAGE:
    case ML_REQERR_IMAGE_EVICTED: return SVC_ERROR_INVALID_IMAGE;
    case ML_REQERR_CONTEXT_LENGTH: return SVC_ERROR_CONTEXT_LENGTH_EXCEEDED;
    case ML_REQERR_TOO_LARGE: return SVC_ERROR_IMAGE_TOO_LARGE;
    case ML_REQERR_UNKNOWN_ADAPTER: return SVC_ERROR_UNKNOWN_ADAPTER;
    case ML_REQERR_INTERNAL: return SVC_ERROR_INTERNAL;
    }
    return SVC_ERROR_INTERNAL;
}

static svc_reply_ctx reply_ctx(const svc_worker *w, const job *j)
{
    return (svc_reply_ctx){.id = j->id, .model = w->model_name,
                           .created = (int64_t)time(NULL), .attempt = j->attempt};
}

/* A token's text for logprobs: its bytes as the tokenizer holds them. */
static svc_token_logprob token_logprob(const svc_worker *w, int32_t id, float logprob)
{
    size_t len = 0;
    const char *s = ml_tokenizer_token_bytes(w->tok, id, &len);
    return (svc_token_logprob){.token = s ? s : "", .token_len = s ? len : 0,
                               .logprob = logprob};
}

/* A token's logprobs entry; its alternatives go to top (lp->n_top slots). */
static svc_logprob_entry logprob_entry(const svc_worker *w, int32_t id, const ml_sample_out *lp,
                                       svc_token_logprob *top)
{
    for (uint32_t k = 0; k < lp->n_top; k++)
        top[k] = token_logprob(w, lp->top[k].id, lp->top[k].logprob);
    return (svc_logprob_entry){.chosen = token_logprob(w, id, lp->chosen.logprob), .top = top,
                               .n_top = lp->n_top};
}

/* What a completion without tokens points its logprobs at: "content":[]. */
static const svc_logprob_entry no_logprobs;
/* Entries a stream: false job's logprobs start with; they double from there. */
#define LOGPROBS_INITIAL 64

/* Where the alternatives of a stream: false job's entry i are (NULL when
 * the request wants none: lp_top is then never allocated). */
static svc_token_logprob *lp_tops(const job *j, size_t i)
{
    size_t n_top = j->sampling.top_logprobs;
    return n_top ? j->lp_top + i * n_top : NULL;
}

/* Keep a stream: false token's logprobs for the completion. */
static void keep_logprobs(const svc_worker *w, job *j, int32_t id, const ml_sample_out *lp)
{
    size_t n_top = j->sampling.top_logprobs;
    if (j->lp_failed)
        return;
    if (j->n_lp == j->lp_cap) {
        size_t cap = j->lp_cap ? 2 * j->lp_cap : LOGPROBS_INITIAL;
        svc_logprob_entry *e = realloc(j->lp, cap * sizeof *e);
        if (e)
            j->lp = e;
        svc_token_logprob *t = n_top ? realloc(j->lp_top, cap * n_top * sizeof *t) : NULL;
        if (t)
            j->lp_top = t;
        if (!e || (n_top && !t)) {
            j->lp_failed = true;
            return;
        }
        j->lp_cap = cap;
    }
    /* The entry's top is pointed again when the completion is written:
     * lp_top may move while it grows. */
    j->lp[j->n_lp] = logprob_entry(w, id, lp, lp_tops(j, j->n_lp));
    j->n_lp++;
}

/* With tools, what a fragment of the answer adds (tool_stream.h): its
 * prose in *text, and the call's share in *call (NULL when none). */
static const svc_reply_call *tool_share(job *j, svc_tool_delta d, const char **text,
                                        size_t *len, svc_reply_call *call)
{
    *text = d.content;
    *len = d.content_len;
    if (!d.call_begins && !d.arguments_len)
        return NULL;
    *call = (svc_reply_call){.id = j->call_id,
                             .name = d.call_begins ? svc_tool_stream_name(&j->tool) : NULL,
                             .arguments = d.arguments, .arguments_len = d.arguments_len};
    return call;
}

/* A stream: false job's share of a fragment: prose, or the call's
 * arguments (the message's content is then null), both into j->text. */
static void keep_text(job *j, const char *text, size_t len, const svc_reply_call *call)
{
    if (len)
        svc_buf_printf(&j->text, "%.*s", (int)len, text);
    if (call && call->arguments_len)
        svc_buf_printf(&j->text, "%.*s", (int)call->arguments_len, call->arguments);
}

static void on_token(void *ctx, int32_t id, const char *text, size_t len, const ml_sample_out *lp)
{
    job *j = ctx;
    svc_worker *w = j->w;
    double now = svc_now_s();
    svc_metrics_add(SVC_COUNTER_TOKENS_GENERATED, 1);
    if (j->n_tokens++ == 0)
        svc_metrics_observe(SVC_HIST_TTFT, now - j->t_handoff);
    else
        svc_metrics_observe(SVC_HIST_INTER_TOKEN, now - j->t_last);
    j->t_last = now;
    if (atomic_load(&j->abandoned))
        return;
    svc_reply_call call_buf;
    const svc_reply_call *call =
        j->tools ? tool_share(j, svc_tool_stream_feed(&j->tool, text, len), &text, &len, &call_buf)
                 : NULL;
    if (!j->stream) {
        keep_text(j, text, len, call);
        if (lp)
            keep_logprobs(w, j, id, lp);
        return;
    }
    /* Nothing to send while a character or a possible stop string is held
     * back, unless the client wants this token's logprobs. */
    if (!len && !lp && !call)
        return;
    svc_token_logprob top[ML_SAMPLE_MAX_TOP];
    svc_logprob_entry entry;
    if (lp)
        entry = logprob_entry(w, id, lp, top);
    svc_reply r = {.seq = j->seq, .content = text, .content_len = len, .call = call,
                   .logprobs = lp ? &entry : NULL, .n_logprobs = lp ? 1 : 0};
    svc_reply_ctx rc = reply_ctx(w, j);
    svc_buf b;
    svc_buf_init(&b);
    if (svc_reply_chunk(&b, &rc, &r) == 0 && worker_produce_chunk(w, j, &b, j->seq) == 0)
        j->seq++;
    svc_buf_deinit(&b);
}

/* The final record of j (fin not an error): a last chunk, or the whole
 * chat.completion of a stream: false job. Its delivery frees j; a record
 * that cannot be produced frees j now (the offset stays, the message comes
 * back). @locality the thread holding j. */
static void reply_final(svc_worker *w, job *j, svc_finish fin, const char *tail, size_t tail_len,
                        const svc_usage *u, const svc_timings *t)
{
    if (!j->stream && j->lp_failed) {
        worker_reply_error(w, j, SVC_ERROR_INTERNAL, "out of memory for the logprobs");
        return;
    }
    svc_reply_call call_buf;
    const svc_reply_call *call = NULL;
    if (j->tools) {
        svc_tool_delta d = svc_tool_stream_feed(&j->tool, tail, tail_len);
        if (!d.content_len && !d.call_begins && !d.arguments_len)
            d = svc_tool_stream_end(&j->tool);
        call = tool_share(j, d, &tail, &tail_len, &call_buf);
        /* A call whose document is complete ends the answer: OpenAI's
         * finish_reason for it (one cut by max_tokens stays "length"). */
        if (fin == SVC_FINISH_STOP && svc_tool_stream_called(&j->tool))
            fin = SVC_FINISH_TOOL_CALLS;
    }
    svc_metrics_finished(fin);
    svc_reply_ctx rc = reply_ctx(w, j);
    svc_buf b;
    svc_buf_init(&b);
    int built;
    if (j->stream) {
        svc_reply r = {.seq = j->seq, .content = tail, .content_len = tail_len, .call = call,
                       .finish = fin, .usage = u, .timings = t};
        built = svc_reply_chunk(&b, &rc, &r);
    } else {
        keep_text(j, tail, tail_len, call);
        for (size_t i = 0; i < j->n_lp; i++)
            j->lp[i].top = lp_tops(j, i);
        /* The message: the call, whose arguments j->text holds, once its
         * name is known; else the prose. */
        svc_reply_call whole = {.id = j->call_id,
                                .name = j->tools ? svc_tool_stream_name(&j->tool) : NULL,
                                .arguments = j->text.data, .arguments_len = j->text.len};
        svc_reply r = {.seq = 0, .content = j->text.data, .content_len = j->text.len,
                       .call = whole.name ? &whole : NULL,
                       .logprobs = !j->sampling.logprobs ? NULL : j->lp ? j->lp : &no_logprobs,
                       .n_logprobs = j->n_lp,
                       .finish = fin, .usage = u, .timings = t};
        built = svc_reply_completion(&b, &rc, &r);
    }
    uint32_t seq = j->stream ? j->seq : 0;
    if (built != 0)
        worker_reply_error(w, j, SVC_ERROR_INTERNAL, "out of memory for the reply");
    else
        worker_produce_final(w, j, &b, seq);
    svc_buf_deinit(&b);
}

static void on_finish(void *ctx, const char *tail, size_t tail_len, ml_finish_reason reason,
                      ml_request_error error, const char *message, const ml_usage *u)
{
    job *j = ctx;
    svc_worker *w = j->w;
    if (error == ML_REQERR_IMAGE_EVICTED) {
        /* An inline image's state was evicted between prep and admission
         * and nothing was generated. Not decoded here: the prep pool decodes
         * the images and sends the job back (redecode, worker_prep.c). Until
         * then no handle is the job's; nothing is counted (the second run
         * is). */
        j->redecode = true;
        j->handle = 0;
        job_queue_push(&w->prep_q, j);
        return;
    }
    svc_metrics_add(SVC_COUNTER_PROMPT_TOKENS, (uint64_t)u->prompt_tokens);
    svc_metrics_add(SVC_COUNTER_PROMPT_TOKENS_CACHED, (uint64_t)u->prompt_tokens_cached);
    svc_metrics_add(SVC_COUNTER_IMAGE_CACHE_HITS, (uint64_t)u->images_cached);
    svc_metrics_add(SVC_COUNTER_IMAGE_CACHE_MISSES, (uint64_t)(u->images - u->images_cached));
    svc_metrics_add(SVC_COUNTER_PREEMPTIONS, (uint64_t)u->preemptions);
    if (u->vision_ms > 0)
        svc_metrics_observe(SVC_HIST_VISION_ENCODE, u->vision_ms / 1000.0);
    if (atomic_load(&j->abandoned)) {
        job_free(j); /* its partition moved on: the new owner answers it */
        return;
    }
    svc_error code = reason == ML_FINISH_REASON_DEADLINE ? SVC_ERROR_DEADLINE_EXCEEDED
                                                         : error_of(error);
    if (code != SVC_ERROR_NONE) {
        worker_reply_error(w, j, code, message ? message : svc_error_code(code));
        return;
    }
    svc_finish fin = finish_of(reason);
    svc_metrics_observe(SVC_HIST_REQUEST_DURATION, svc_now_s() - j->t_handoff);
    /* Waiting for a batch slot: held here, then in the runtime's queue. */
    double held_s = j->t_submit - j->t_handoff, runtime_s = u->queue_ms / 1000.0;
    svc_metrics_tenant_queue(job_tenant(j), j->t_submit - j->t_consumed + runtime_s);
    svc_usage usage = {.prompt_tokens = (uint32_t)u->prompt_tokens,
                       .prompt_tokens_cached = (uint32_t)u->prompt_tokens_cached,
                       .completion_tokens = (uint32_t)u->completion_tokens,
                       .images = (uint32_t)u->images, .images_cached = (uint32_t)u->images_cached};
    svc_timings timings = {.queue_ms = (held_s + runtime_s) * 1000.0, .vision_ms = u->vision_ms,
                           .prefill_ms = u->prefill_ms, .decode_ms = u->decode_ms,
                           .ttft_ms = u->ttft_ms};
    reply_final(w, j, fin, tail, tail_len, &usage, &timings);
}

void worker_reply_cancelled(svc_worker *w, job *j, const char *why)
{
    svc_log(SVC_LOG_INFO, "request_cancelled", "request %s attempt %u: %s", j->id, j->attempt,
            why);
    svc_usage usage = {0};
    svc_timings timings = {0};
    reply_final(w, j, SVC_FINISH_CANCELLED, NULL, 0, &usage, &timings);
}

/* Submit a prepared job, or park it (w->parked) while older executions of
 * its request end. After ml_runtime_submit the job belongs to the
 * runtime's callbacks (which may already have run and handed it to a
 * delivery report): it is not touched again here. */
static void submit(svc_worker *w, job *j)
{
    if (atomic_load(&j->abandoned)) {
        job_free(j);
        return;
    }
    switch (worker_cancel_before_submit(w, j)) {
    case SUBMIT_RUN: break;
    case SUBMIT_CANCELLED:
        worker_reply_cancelled(w, j, atomic_load(&j->replaced)
                                         ? "replaced by a newer execution before it started"
                                         : "cancelled before it started");
        return;
    case SUBMIT_WAIT:
        j->next = w->parked;
        w->parked = j;
        return;
    }
    svc_request *req = j->req;
    ml_request_image *images = j->images;
    int n_images = j->n_images;
    bool keep_req = j->keep_req; /* j may be gone once submitted */
    if (!keep_req)
        j->req = NULL;
    j->images = NULL;
    j->n_images = 0;
    ml_request r = {
        .prompt = j->prompt.ids, .n_prompt = (int)j->prompt.n, .images = images,
        .n_images = n_images, .sampling = j->sampling, .deadline_ms = req->deadline_ms,
        .adapter = req->adapter,
        .cb = {.on_token = on_token, .on_finish = on_finish, .ctx = j},
    };
    /* The tenant's cache partition (runtime.h ml_request.cache_salt; the
     * same size: config.h). */
    memcpy(r.cache_salt, j->tenant->cache_salt, sizeof r.cache_salt);
    char err[256];
    j->t_submit = svc_now_s();
    ml_status st = ml_runtime_submit(w->rt, &r, &j->handle, err, sizeof err);
    /* The runtime copied the prompt and the stop strings and took the pixels. */
    free(images);
    if (!keep_req)
        svc_request_destroy(req);
    if (st != ML_OK) {
        /* Nothing was queued and no callback ran: j is still ours. */
        ml_token_buf_deinit(&j->prompt);
        worker_reply_error(w, j, SVC_ERROR_INTERNAL, err);
    }
}

/* ---- holding and admission -------------------------------------------------- */

/* Whether a held job was stopped while it waited: it ends now, through
 * submit, which sees why (not when its turn would have come). */
static bool stopped_while_held(const svc_fair_item *it, void *ctx)
{
    svc_worker *w = ctx;
    const job *j = job_of_fair(it);
    return atomic_load(&w->cancel_all) || atomic_load(&j->abandoned) || worker_job_stopped(w, j);
}

/* End the held jobs a cancel, a revocation or the drain's end reached, and
 * those a parked retry replaced (it waits for them to end). Before
 * worker_cancels_apply, which clears cancel_scan. */
static void sweep_held(svc_worker *w)
{
    if (!atomic_load(&w->cancel_scan) && !atomic_load(&w->cancel_all) && !w->parked)
        return;
    for (svc_fair_item *it; (it = svc_fair_take(w->fair, stopped_while_held, w));)
        submit(w, job_of_fair(it));
}

/* Hand held jobs to the runtime while its batch has room, the next one by
 * tenant weight. The runtime's own queue is first come, first served:
 * jobs wait here instead, so that the order across tenants is decided
 * here; the runtime holds at most max_running (running and waiting for
 * KV blocks), so no slot stays empty for longer than one step. */
static void admit_held(svc_worker *w)
{
    while (ml_runtime_active(w->rt) < w->cfg.runtime.max_running) {
        svc_fair_item *it = svc_fair_pop(w->fair, NULL);
        if (!it)
            break;
        submit(w, job_of_fair(it));
    }
}

static void publish_gauges(svc_worker *w)
{
    ml_runtime_stats st;
    ml_runtime_get_stats(w->rt, &st);
    svc_metrics_add(SVC_COUNTER_ADAPTER_LOADS, st.adapters.loads - w->adapter_loads_seen);
    w->adapter_loads_seen = st.adapters.loads;
    svc_metrics_add(SVC_COUNTER_PREFIX_BLOCK_HITS, st.prefix_block_hits - w->prefix_seen.hits);
    svc_metrics_add(SVC_COUNTER_PREFIX_BLOCK_MISSES,
                    st.prefix_block_misses - w->prefix_seen.misses);
    svc_metrics_add(SVC_COUNTER_KV_BLOCKS_EVICTED, st.kv_blocks_evicted - w->prefix_seen.evicted);
    w->prefix_seen.hits = st.prefix_block_hits;
    w->prefix_seen.misses = st.prefix_block_misses;
    w->prefix_seen.evicted = st.kv_blocks_evicted;
    svc_metrics_set(SVC_GAUGE_KV_BLOCKS_CACHED, st.kv_blocks_cached);
    svc_metrics_set(SVC_GAUGE_REQUESTS_WAITING, st.waiting + (double)svc_fair_total(w->fair));
    svc_metrics_set(SVC_GAUGE_REQUESTS_RUNNING, st.running);
    svc_metrics_set(SVC_GAUGE_KV_BLOCKS_USED, st.kv_blocks_total - st.kv_blocks_free);
    svc_metrics_set(SVC_GAUGE_IMAGE_CACHE_BYTES, (double)st.image_bytes_used);
    uint64_t free_kv = (uint64_t)st.kv_blocks_free * ml_model_kv_block_bytes(w->model);
    size_t free_images = st.image_bytes_used < st.image_bytes_budget
                             ? st.image_bytes_budget - st.image_bytes_used
                             : 0;
    atomic_store(&w->free_pool_bytes, free_kv + free_images);
}

/* Ask again for every parked job, oldest first (the list is newest first:
 * it is taken whole and resubmitted in reverse). */
static void submit_parked(svc_worker *w)
{
    job *rev = NULL;
    for (job *j = w->parked, *next; j; j = next) {
        next = j->next;
        j->next = rev;
        rev = j;
    }
    w->parked = NULL;
    for (job *j = rev, *next; j; j = next) {
        next = j->next;
        submit(w, j);
    }
}

void *worker_step_main(void *arg)
{
    svc_worker *w = arg;
    char err[512];
    while (!atomic_load(&w->threads_stop)) {
        atomic_store(&w->health.step_heartbeat_ms, svc_now_ms());
        submit_parked(w);
        /* Idle, a parked job waits for delivery reports: look again soon. */
        bool busy = ml_runtime_active(w->rt) || svc_fair_total(w->fair);
        int wait = busy ? 0 : w->parked ? PARKED_WAIT_MS : IDLE_WAIT_MS;
        for (job *j; (j = job_queue_pop(&w->step_q, wait));) {
            svc_fair_push(w->fair, job_tenant(j), &j->fair);
            wait = 0;
        }
        sweep_held(w);
        admit_held(w);
        worker_cancels_apply(w);
        if (ml_runtime_active(w->rt) > 0 && ml_runtime_step(w->rt, err, sizeof err) != ML_OK) {
            worker_fail(w, SVC_WORKER_EXIT_DEVICE, "backend: %s", err);
            break;
        }
        publish_gauges(w);
    }
    return NULL;
}
