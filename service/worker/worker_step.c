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
/* Entries a stream: false choice's logprobs start with; they double from there. */
#define LOGPROBS_INITIAL 64

/* Where the alternatives of a stream: false choice's entry i are (NULL when
 * the request wants none: lp_top is then never allocated). */
static svc_token_logprob *lp_tops(const job_choice *c, size_t i)
{
    size_t n_top = c->j->sampling.top_logprobs;
    return n_top ? c->lp_top + i * n_top : NULL;
}

/* Keep a stream: false token's logprobs for the completion. */
static void keep_logprobs(const svc_worker *w, job_choice *c, int32_t id, const ml_sample_out *lp)
{
    size_t n_top = c->j->sampling.top_logprobs;
    if (c->lp_failed)
        return;
    if (c->n_lp == c->lp_cap) {
        size_t cap = c->lp_cap ? 2 * c->lp_cap : LOGPROBS_INITIAL;
        svc_logprob_entry *e = realloc(c->lp, cap * sizeof *e);
        if (e)
            c->lp = e;
        svc_token_logprob *t = n_top ? realloc(c->lp_top, cap * n_top * sizeof *t) : NULL;
        if (t)
            c->lp_top = t;
        if (!e || (n_top && !t)) {
            c->lp_failed = true;
            return;
        }
        c->lp_cap = cap;
    }
    /* The entry's top is pointed again when the completion is written:
     * lp_top may move while it grows. */
    c->lp[c->n_lp] = logprob_entry(w, id, lp, lp_tops(c, c->n_lp));
    c->n_lp++;
}

/* Produce a streamed chunk of choice c; the seq advances when it was sent. */
static void send_chunk(svc_worker *w, job_choice *c, svc_reply *r)
{
    job *j = c->j;
    r->seq = j->seq;
    r->index = c->index;
    r->role = !c->started;
    svc_reply_ctx rc = reply_ctx(w, j);
    svc_buf b;
    svc_buf_init(&b);
    if (svc_reply_chunk(&b, &rc, r) == 0 && worker_produce_chunk(w, j, &b, j->seq) == 0) {
        j->seq++;
        c->started = true;
    }
    svc_buf_deinit(&b);
}

/* With tools, what a fragment of choice c's answer adds (tool_stream.h):
 * its prose in *text, and the call's share in *call (NULL when none). */
static const svc_reply_call *tool_share(job_choice *c, svc_tool_delta d, const char **text,
                                        size_t *len, svc_reply_call *call)
{
    *text = d.content;
    *len = d.content_len;
    if (!d.call_begins && !d.arguments_len)
        return NULL;
    *call = (svc_reply_call){.id = c->call_id,
                             .name = d.call_begins ? svc_tool_stream_name(&c->tool) : NULL,
                             .arguments = d.arguments, .arguments_len = d.arguments_len};
    return call;
}

/* Text for c->text, which holds a stream: false choice's answer (and the
 * held-back tail of a streamed one): prose, or the call's arguments (the
 * message's content is then null). */
static void keep_text(job_choice *c, const char *text, size_t len, const svc_reply_call *call)
{
    if (len)
        svc_buf_printf(&c->text, "%.*s", (int)len, text);
    if (call && call->arguments_len)
        svc_buf_printf(&c->text, "%.*s", (int)call->arguments_len, call->arguments);
}

static void on_token(void *ctx, int32_t id, const char *text, size_t len, const ml_sample_out *lp)
{
    job_choice *c = ctx;
    job *j = c->j;
    svc_worker *w = j->w;
    double now = svc_now_s();
    svc_metrics_add(SVC_COUNTER_TOKENS_GENERATED, 1);
    if (j->n_tokens++ == 0)
        svc_metrics_observe(SVC_HIST_TTFT, now - j->t_handoff);
    else
        svc_metrics_observe(SVC_HIST_INTER_TOKEN, now - j->t_last);
    j->t_last = now;
    if (atomic_load(&j->abandoned) || j->error != SVC_ERROR_NONE)
        return;
    svc_reply_call call_buf;
    const svc_reply_call *call =
        j->tools ? tool_share(c, svc_tool_stream_feed(&c->tool, text, len), &text, &len, &call_buf)
                 : NULL;
    if (!j->stream) {
        keep_text(c, text, len, call);
        if (lp)
            keep_logprobs(w, c, id, lp);
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
    svc_reply r = {.content = text, .content_len = len, .call = call,
                   .logprobs = lp ? &entry : NULL, .n_logprobs = lp ? 1 : 0};
    send_chunk(w, c, &r);
}

/* Choice c as the completion holds it: its answer (a call, once its name
 * is known, whose arguments c->text holds; else the prose), logprobs and
 * finish. */
static svc_reply completion_choice(job_choice *c)
{
    for (size_t i = 0; i < c->n_lp; i++)
        c->lp[i].top = lp_tops(c, i);
    c->call = (svc_reply_call){.id = c->call_id,
                               .name = c->j->tools ? svc_tool_stream_name(&c->tool) : NULL,
                               .arguments = c->text.data, .arguments_len = c->text.len};
    return (svc_reply){.content = c->text.data, .content_len = c->text.len,
                       .call = c->call.name ? &c->call : NULL,
                       .logprobs = !c->j->sampling.logprobs ? NULL
                                   : c->lp                   ? c->lp
                                                             : &no_logprobs,
                       .n_logprobs = c->n_lp, .finish = c->finish};
}

/* The final record of j, every choice ended without an error: with n = 1
 * the choice's last chunk (its held-back tail in its text), with n > 1
 * "choices":[] (each choice's last chunk went out when it ended), or the
 * whole chat.completion of a stream: false job. Its delivery frees j; a
 * record that cannot be produced frees j now (the offset stays, the
 * message comes back). @locality the thread holding j. */
static void reply_final(svc_worker *w, job *j, const svc_usage *u, const svc_timings *t)
{
    for (uint32_t i = 0; i < j->n_choices; i++)
        if (!j->stream && j->choices[i].lp_failed) {
            worker_reply_error(w, j, SVC_ERROR_INTERNAL, "out of memory for the logprobs");
            return;
        }
    svc_metrics_finished(j->choices[0].finish);
    svc_reply_ctx rc = reply_ctx(w, j);
    svc_buf b;
    svc_buf_init(&b);
    int built;
    if (j->stream) {
        job_choice *c = &j->choices[0];
        svc_reply r = {.seq = j->seq, .role = !c->started, .usage = u, .timings = t};
        if (j->n_choices > 1) {
            r.no_choices = true;
        } else {
            r.content = c->text.data;
            r.content_len = c->text.len;
            r.finish = c->finish;
        }
        built = svc_reply_chunk(&b, &rc, &r);
    } else {
        svc_reply *r = calloc(j->n_choices, sizeof *r);
        for (uint32_t i = 0; r && i < j->n_choices; i++)
            r[i] = completion_choice(&j->choices[i]);
        if (r) {
            r[0].usage = u;
            r[0].timings = t;
        }
        built = r ? svc_reply_completion_n(&b, &rc, r, j->n_choices) : -1;
        free(r);
    }
    uint32_t seq = j->stream ? j->seq : 0;
    if (built != 0)
        worker_reply_error(w, j, SVC_ERROR_INTERNAL, "out of memory for the reply");
    else
        worker_produce_final(w, j, &b, seq);
    svc_buf_deinit(&b);
}

/* Choice c ended (fin, not an error): a streamed choice of several sends
 * its last chunk now, with its tail and finish_reason; otherwise the tail
 * waits for the final record in c's text. */
static void end_choice(svc_worker *w, job_choice *c, svc_finish fin, const char *tail,
                       size_t tail_len)
{
    job *j = c->j;
    svc_reply_call call_buf;
    const svc_reply_call *call = NULL;
    if (j->tools) {
        svc_tool_delta d = svc_tool_stream_feed(&c->tool, tail, tail_len);
        if (!d.content_len && !d.call_begins && !d.arguments_len)
            d = svc_tool_stream_end(&c->tool);
        call = tool_share(c, d, &tail, &tail_len, &call_buf);
        /* A call whose document is complete ends the answer: OpenAI's
         * finish_reason for it (one cut by max_tokens stays "length"). */
        if (fin == SVC_FINISH_STOP && svc_tool_stream_called(&c->tool))
            fin = SVC_FINISH_TOOL_CALLS;
    }
    c->finish = fin;
    if (j->stream && j->n_choices > 1) {
        svc_reply r = {.content = tail, .content_len = tail_len, .call = call, .finish = fin};
        send_chunk(w, c, &r);
    } else if (j->stream && call) {
        /* The final record of n = 1 carries the tail as text: a call's
         * share of it goes out first, in a chunk of its own. */
        svc_reply r = {.content = tail, .content_len = tail_len, .call = call};
        send_chunk(w, c, &r);
    } else {
        keep_text(c, tail, tail_len, call);
    }
}

/* Every choice of j ended: its final record, or the error one of them
 * ended with. The request's prompt, images and queue are choice 0's (the
 * others were forked off it: runtime.h ml_request.n), its completion
 * tokens and preemptions the sum over the choices. */
static void end_job(svc_worker *w, job *j)
{
    const ml_usage *u0 = &j->choices[0].usage;
    svc_usage usage = {.prompt_tokens = (uint32_t)u0->prompt_tokens,
                       .prompt_tokens_cached = (uint32_t)u0->prompt_tokens_cached,
                       .images = (uint32_t)u0->images,
                       .images_cached = (uint32_t)u0->images_cached};
    double decode_ms = 0;
    uint64_t preemptions = 0;
    for (uint32_t i = 0; i < j->n_choices; i++) {
        const ml_usage *u = &j->choices[i].usage;
        usage.completion_tokens += (uint32_t)u->completion_tokens;
        preemptions += (uint64_t)u->preemptions;
        decode_ms = u->decode_ms > decode_ms ? u->decode_ms : decode_ms;
    }
    svc_metrics_add(SVC_COUNTER_PROMPT_TOKENS, usage.prompt_tokens);
    svc_metrics_add(SVC_COUNTER_PROMPT_TOKENS_CACHED, usage.prompt_tokens_cached);
    svc_metrics_add(SVC_COUNTER_IMAGE_CACHE_HITS, usage.images_cached);
    svc_metrics_add(SVC_COUNTER_IMAGE_CACHE_MISSES, usage.images - usage.images_cached);
    svc_metrics_add(SVC_COUNTER_PREEMPTIONS, preemptions);
    if (u0->vision_ms > 0)
        svc_metrics_observe(SVC_HIST_VISION_ENCODE, u0->vision_ms / 1000.0);
    if (atomic_load(&j->abandoned)) {
        job_free(j); /* its partition moved on: the new owner answers it */
        return;
    }
    if (j->error != SVC_ERROR_NONE) {
        worker_reply_error(w, j, j->error, j->error_message);
        return;
    }
    svc_metrics_observe(SVC_HIST_REQUEST_DURATION, svc_now_s() - j->t_handoff);
    /* Waiting for a batch slot: held here, then in the runtime's queue. */
    double held_s = j->t_submit - j->t_handoff, runtime_s = u0->queue_ms / 1000.0;
    svc_metrics_tenant_queue(job_tenant(j), j->t_submit - j->t_consumed + runtime_s);
    svc_timings timings = {.queue_ms = (held_s + runtime_s) * 1000.0,
                           .vision_ms = u0->vision_ms, .prefill_ms = u0->prefill_ms,
                           .decode_ms = decode_ms, .ttft_ms = u0->ttft_ms};
    reply_final(w, j, &usage, &timings);
}

static void on_finish(void *ctx, const char *tail, size_t tail_len, ml_finish_reason reason,
                      ml_request_error error, const char *message, const ml_usage *u)
{
    job_choice *c = ctx;
    job *j = c->j;
    svc_worker *w = j->w;
    c->ended = true;
    c->usage = *u;
    bool last = ++j->n_ended == j->n_choices;
    if (error == ML_REQERR_IMAGE_EVICTED) {
        /* An inline image's state was evicted between prep and admission
         * and nothing was generated (by any choice: they end together).
         * Not decoded here: the prep pool decodes the images and sends the
         * job back (redecode, worker_prep.c). Until then no handle is the
         * job's; nothing is counted (the second run is). */
        if (!last)
            return;
        job_choices_reset(j);
        j->redecode = true;
        j->handle = 0;
        job_queue_push(&w->prep_q, j);
        return;
    }
    svc_error code = reason == ML_FINISH_REASON_DEADLINE ? SVC_ERROR_DEADLINE_EXCEEDED
                                                         : error_of(error);
    if (code != SVC_ERROR_NONE && j->error == SVC_ERROR_NONE) {
        /* The request's error: the other choices' records stop here, and
         * the choices still running are cancelled after this step
         * (worker_cancels_apply; not from inside the runtime's callback). */
        j->error = code;
        snprintf(j->error_message, sizeof j->error_message, "%s",
                 message ? message : svc_error_code(code));
        if (!last)
            atomic_store(&w->cancel_scan, true);
    } else if (code == SVC_ERROR_NONE && !atomic_load(&j->abandoned) &&
               j->error == SVC_ERROR_NONE) {
        end_choice(w, c, finish_of(reason), tail, tail_len);
    }
    if (last)
        end_job(w, j);
}

void worker_reply_cancelled(svc_worker *w, job *j, const char *why)
{
    svc_log(SVC_LOG_INFO, "request_cancelled", "request %s attempt %u: %s", j->id, j->attempt,
            why);
    for (uint32_t i = 0; i < j->n_choices; i++)
        end_choice(w, &j->choices[i], SVC_FINISH_CANCELLED, NULL, 0);
    svc_usage usage = {0};
    svc_timings timings = {0};
    reply_final(w, j, &usage, &timings);
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
    ml_request_callbacks choices[SVC_MAX_N_LIMIT];
    for (uint32_t i = 0; i < j->n_choices; i++)
        choices[i] = (ml_request_callbacks){.on_token = on_token, .on_finish = on_finish,
                                            .ctx = &j->choices[i]};
    ml_request r = {
        .prompt = j->prompt.ids, .n_prompt = (int)j->prompt.n, .images = images,
        .n_images = n_images, .sampling = j->sampling, .deadline_ms = req->deadline_ms,
        .adapter = req->adapter, .cb = choices[0], .n = (int)j->n_choices, .choices = choices,
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
    svc_metrics_add(SVC_COUNTER_PREFILL_TOKENS, st.prefill_tokens - w->prefix_seen.prefill);
    svc_metrics_add(SVC_COUNTER_CHOICES_FORKED, st.choices_forked - w->prefix_seen.forked);
    w->prefix_seen.prefill = st.prefill_tokens;
    w->prefix_seen.forked = st.choices_forked;
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
            j->fair.cost = j->n_choices; /* n choices: n sequences' share */
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
