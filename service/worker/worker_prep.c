/* The prep pool: from a consumed record to a job the step thread can
 * submit. Attempt counting (poison messages), parsing and validation, image
 * decoding and preprocessing (or the resident-state shortcut, or the Redis
 * blob), the JSON schema's grammar (schema_cache.h), the chat template and
 * the sampling controls. Every failure here is answered at once with an
 * error record or a dead letter.
 *
 * worker.prep_threads threads run worker_prep_main, each popping prep_q and
 * preparing one job at a time, so a request with heavy images holds one
 * thread and the others keep preparing the rest. What they share is
 * thread-safe: the worker's configuration, image parameters, tokenizer and
 * model config are immutable once started; the resident mirror, the
 * producer, metrics and logs lock or are atomic; the uncounted-attempt
 * numbers are an atomic counter; the adapter store (adapter_store.h) copies
 * each adapter into its own staging directory, so threads fetching the same
 * one do not collide. Each thread has its own Redis connection (prep_redis).
 * @locality: a prep thread. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "metrics.h"
#include "protocol/json_span.h"
#include "worker/worker_internal.h"

#define PREP_POLL_MS 200

/* This thread's Redis connection (its prep_thread's, set by
 * worker_prep_main; NULL without Redis). A connection serves one thread
 * (redis/redis.h). */
static _Thread_local svc_redis *prep_redis;
/* This thread's entry of the health watchdog (svc_health.watch): what it
 * is doing and since when, read by /healthz. */
static _Thread_local svc_watch *prep_watch;

static svc_bytes header(const job *j, const char *name)
{
    svc_bytes b = {NULL, 0};
    svc_kafka_msg_header(&j->msg, name, &b.ptr, &b.len);
    return b;
}

static void hex_to_key(const char *hex, uint8_t *key)
{
    for (int i = 0; i < ML_IMAGE_KEY_BYTES; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        key[i] = (uint8_t)v;
    }
}

static svc_error image_status_error(ml_status st)
{
    return st == ML_ERR_TOO_LARGE ? SVC_ERROR_IMAGE_TOO_LARGE
           : st == ML_ERR_NOMEM   ? SVC_ERROR_INTERNAL
                                  : SVC_ERROR_INVALID_IMAGE;
}

/* Decode and preprocess bytes into im (pixels owned by im). */
static svc_error prepare_pixels(svc_worker *w, const uint8_t *bytes, size_t n, int index,
                                ml_request_image *im, char *msg, size_t msglen)
{
    char err[256];
    ml_status st = ml_engine_prepare_image(w->engine, bytes, n, im, err, sizeof err);
    if (st != ML_OK) {
        svc_errf(msg, msglen, "image %d: %s", index, err);
        return image_status_error(st);
    }
    return SVC_ERROR_NONE;
}

/* Count the decoded pixels of image `index` (bytes) against the request's
 * budget, limits.max_request_pixels, from its header alone (ml_image_probe:
 * also the per-image size and scan limits), before anything is decoded.
 * j->pixels accumulates over the request's images. */
static svc_error count_pixels(svc_worker *w, job *j, const uint8_t *bytes, size_t n, int index,
                              char *msg, size_t msglen)
{
    ml_image_info info;
    char err[256];
    ml_status st = ml_image_probe(bytes, n, &ml_engine_image_params(w->engine)->limits, &info,
                                  err, sizeof err);
    if (st != ML_OK) {
        svc_errf(msg, msglen, "image %d: %s", index, err);
        return image_status_error(st);
    }
    j->pixels += (uint64_t)info.width * info.height;
    if (j->pixels > (uint64_t)w->cfg.limits.max_request_pixels) {
        svc_errf(msg, msglen,
                 "image %d (%ux%u) brings the request's images to %" PRIu64
                 " pixels, above limits.max_request_pixels (%ld)",
                 index, info.width, info.height, j->pixels, w->cfg.limits.max_request_pixels);
        return SVC_ERROR_IMAGE_TOO_LARGE;
    }
    return SVC_ERROR_NONE;
}

/* prepare_pixels for bytes count_pixels has not seen yet (a Redis blob). */
static svc_error prepare_counted(svc_worker *w, job *j, const uint8_t *bytes, size_t n, int index,
                                 ml_request_image *im, char *msg, size_t msglen)
{
    svc_error e = count_pixels(w, j, bytes, n, index, msg, msglen);
    return e != SVC_ERROR_NONE ? e : prepare_pixels(w, bytes, n, index, im, msg, msglen);
}

/* Every inline image counted before the first is decoded, so a request over
 * its budget is refused without decoding any. */
static svc_error count_inline_pixels(svc_worker *w, job *j, char *msg, size_t msglen)
{
    const svc_request *r = j->req;
    j->pixels = 0;
    for (size_t i = 0; i < r->n_images; i++) {
        const svc_image *img = &r->images[i];
        svc_error e = img->kind == SVC_IMAGE_INLINE
                          ? count_pixels(w, j, img->bytes, img->n_bytes, (int)i, msg, msglen)
                          : SVC_ERROR_NONE;
        if (e != SVC_ERROR_NONE)
            return e;
    }
    return SVC_ERROR_NONE;
}

/* Resolve every image of the request: inline bytes are hashed and
 * preprocessed, unless this worker holds their state (base model only: an
 * adapter may key its own) — then the runtime gets the key, at_caller for
 * the rare eviction before admission (the job comes back: redecode), and
 * the job keeps the request's bytes until it ends; a sha256 reference uses
 * the resident state when this worker has it under the request's adapter,
 * else the blob Redis holds.
 * Every lookup is in the tenant's cache partition: the resident mirror and
 * the blob are found by ml_image_state_key of the content digest and the
 * tenant's cache salt (the key the runtime gives the state), never by the
 * digest itself, so a tenant learns nothing of another group's images.
 * The request's pixel budget is checked from the headers first. */
static svc_error prepare_images(svc_worker *w, job *j, char *msg, size_t msglen)
{
    const svc_request *r = j->req;
    if (r->n_images == 0)
        return SVC_ERROR_NONE;
    svc_error budget = count_inline_pixels(w, j, msg, msglen);
    if (budget != SVC_ERROR_NONE)
        return budget;
    j->images = calloc(r->n_images, sizeof *j->images);
    if (!j->images) {
        svc_errf(msg, msglen, "out of memory");
        return SVC_ERROR_INTERNAL;
    }
    j->n_images = (int)r->n_images;
    const uint8_t *salt = j->tenant->cache_salt;
    for (size_t i = 0; i < r->n_images; i++) {
        const svc_image *img = &r->images[i];
        ml_request_image *im = &j->images[i];
        uint8_t base[ML_IMAGE_KEY_BYTES]; /* the base state's key in the partition */
        svc_error e;
        if (img->kind == SVC_IMAGE_INLINE) {
            ml_sha256(img->bytes, img->n_bytes, im->key);
            ml_image_state_key(salt, im->key, NULL, base);
            if (!r->adapter && !j->redecode && worker_mirror_contains(w, base)) {
                im->n_tiles = 1; /* the resident state's count wins */
                im->at_caller = 1; /* an eviction before admission comes back: redecode */
                j->keep_req = true;
                j->n_skipped++;
                svc_metrics_add(SVC_COUNTER_IMAGE_DECODES_SKIPPED, 1);
                continue;
            }
            e = prepare_pixels(w, img->bytes, img->n_bytes, (int)i, im, msg, msglen);
        } else {
            /* The client's digest is content, whatever it names: the
             * runtime derives the state keys from it (ml_image_state_key). */
            hex_to_key(img->sha256, im->key);
            ml_image_state_key(salt, im->key, NULL, base);
            /* Under an adapter the runtime keys the state by (image,
             * adapter) when the adapter changes image states, which only
             * the loaded adapter tells: a resident state under that key
             * serves; a resident base state may not, so the blob is
             * fetched, and the base state is relied on only without it. */
            uint8_t adapted[ML_IMAGE_KEY_BYTES];
            if (r->adapter)
                ml_image_state_key(salt, im->key, r->adapter, adapted);
            bool base_resident = worker_mirror_contains(w, base);
            if (r->adapter ? worker_mirror_contains(w, adapted) : base_resident) {
                /* No pixels: the runtime uses the resident state and its
                 * tile count. */
                im->n_tiles = 1;
                continue;
            }
            /* Blobs are stored per partition too (service/README.md §3):
             * under the base state's key, so finding one confirms only an
             * upload for this tenant's cache group. */
            char blob_key[ML_SHA256_HEX_SIZE];
            ml_sha256_hex(base, blob_key);
            uint8_t *blob = NULL;
            size_t n = 0;
            svc_watch_begin(prep_watch, "redis blob");
            svc_redis_status rs =
                prep_redis ? svc_redis_blob_get(prep_redis, blob_key, w->limits.max_image_bytes,
                                                &blob, &n)
                           : SVC_REDIS_NOT_FOUND;
            svc_watch_begin(prep_watch, "prepare");
            if (rs != SVC_REDIS_OK && rs != SVC_REDIS_NOT_FOUND)
                svc_metrics_add(SVC_COUNTER_REDIS_ERRORS, 1);
            if (rs != SVC_REDIS_OK && base_resident) {
                /* Served if the adapter leaves images alone; else the
                 * runtime answers that the image is not resident for it. */
                im->n_tiles = 1;
                continue;
            }
            if (rs != SVC_REDIS_OK) {
                svc_errf(msg, msglen,
                         "image %zu: sha256 %s is neither resident on this worker nor held in "
                         "Redis (%s)",
                         i, img->sha256, svc_redis_status_name(rs));
                return rs == SVC_REDIS_ERR_TOO_LARGE ? SVC_ERROR_IMAGE_TOO_LARGE
                                                     : SVC_ERROR_INVALID_IMAGE;
            }
            uint8_t check[ML_IMAGE_KEY_BYTES];
            ml_sha256(blob, n, check);
            e = memcmp(check, im->key, sizeof check)
                    ? (svc_errf(msg, msglen, "image %zu: Redis blob does not hash to %s", i,
                                img->sha256),
                       SVC_ERROR_INVALID_IMAGE)
                    : prepare_counted(w, j, blob, n, (int)i, im, msg, msglen);
            free(blob);
        }
        if (e != SVC_ERROR_NONE)
            return e;
    }
    return SVC_ERROR_NONE;
}

/* The Instruct chat template over the request's messages. Message text is
 * encoded as text (ml_chat_encode): a client's "<|eot_id|>" cannot forge a
 * turn, and the prompt's <|image|> ids are exactly the image parts, one per
 * entry of j->images, which the runtime checks. The date is the request's
 * date_string, else today's in UTC, read when the request is prepared (the
 * template's strftime_now). */
static svc_error build_prompt(svc_worker *w, job *j, char *msg, size_t msglen)
{
    const svc_request *r = j->req;
    size_t n_parts = 0;
    for (size_t m = 0; m < r->n_messages; m++)
        n_parts += r->messages[m].n_parts;
    /* The tools are rendered unless tool_choice is "none": then the answer
     * is text, and the tool block would invite a call it may not make. */
    size_t n_tools = r->tool_choice != SVC_TOOL_CHOICE_NONE ? r->n_tools : 0;
    ml_chat_part *parts = calloc(n_parts + 1, sizeof *parts);
    ml_chat_message *msgs = calloc(r->n_messages + 1, sizeof *msgs);
    const char **tools = calloc(n_tools + 1, sizeof *tools);
    if (!parts || !msgs || !tools) {
        free(parts);
        free(msgs);
        free(tools);
        svc_errf(msg, msglen, "out of memory");
        return SVC_ERROR_INTERNAL;
    }
    ml_chat_part *p = parts;
    for (size_t m = 0; m < r->n_messages; m++) {
        const svc_message *sm = &r->messages[m];
        msgs[m] = (ml_chat_message){.role = svc_role_name(sm->role), .parts = p,
                                    .n_parts = sm->n_parts,
                                    .tool_call_name = sm->tool_call_name,
                                    .tool_call_arguments = sm->tool_call_arguments,
                                    .content_json = sm->content_json};
        for (size_t k = 0; k < sm->n_parts; k++, p++)
            *p = sm->parts[k].kind == SVC_PART_IMAGE
                     ? (ml_chat_part){.type = ML_CHAT_PART_IMAGE}
                     : (ml_chat_part){.type = ML_CHAT_PART_TEXT, .text = sm->parts[k].text};
    }
    for (size_t i = 0; i < n_tools; i++)
        tools[i] = r->tools[i].json;
    char today[ML_CHAT_DATE_BYTES];
    ml_chat_options opt = {.add_generation_prompt = 1,
                           .date_string = r->date_string ? r->date_string
                                                         : ml_chat_date_today(today),
                           .tools = tools, .n_tools = n_tools};
    char err[256];
    ml_status st = ml_chat_encode(w->tok, msgs, r->n_messages, &opt, &j->prompt, err, sizeof err);
    free(parts);
    free(msgs);
    free(tools);
    if (st != ML_OK) {
        svc_errf(msg, msglen, "messages: %s", err);
        return st == ML_ERR_NOMEM ? SVC_ERROR_INTERNAL : SVC_ERROR_INVALID_REQUEST;
    }
    return SVC_ERROR_NONE;
}

/* Make the request's adapter available locally (adapter_store.h), through
 * this prep thread's Redis connection, and have the request name it as the
 * runtime knows it: a copy from Redis by its content, so the runtime's
 * adapter slots and the image states made under it follow a republished
 * adapter. Before the images: their keys under an adapter take its name. */
static svc_error ensure_adapter(svc_worker *w, job *j, char *msg, size_t msglen)
{
    svc_watch_begin(prep_watch, "adapter fetch");
    svc_error e = svc_adapter_store_ensure(&w->adapters, prep_redis, j->req->adapter,
                                           j->adapter_ref, msg, msglen);
    svc_watch_begin(prep_watch, "prepare");
    if (e == SVC_ERROR_NONE)
        j->req->adapter = j->adapter_ref;
    return e;
}

static void build_sampling(svc_worker *w, job *j)
{
    const svc_request *r = j->req;
    ml_sampling_params *s = &j->sampling;
    ml_grammar *grammar = s->grammar; /* prepare_schema's reference, kept */
    ml_sampling_params_default(s);
    s->grammar = grammar;
    s->temperature = r->sampling.temperature;
    s->top_p = r->sampling.top_p;
    s->top_k = r->sampling.top_k > 0 ? (uint32_t)r->sampling.top_k : 0;
    s->min_p = r->sampling.min_p;
    s->repetition_penalty = r->sampling.repetition_penalty;
    s->presence_penalty = r->sampling.presence_penalty;
    s->frequency_penalty = r->sampling.frequency_penalty;
    /* Without a seed, one derived from the record: still reproducible for
     * a redelivery of the same message. */
    s->seed = r->sampling.has_seed ? (uint64_t)r->sampling.seed
                                   : ((uint64_t)j->partition << 48) ^ (uint64_t)j->offset;
    s->max_tokens = r->max_tokens;
    ml_engine_add_stop_ids(w->engine, s);
    for (size_t i = 0; i < r->n_stop && s->n_stop < ML_STOP_MAX_STRINGS; i++) {
        s->stop[s->n_stop] = r->stop[i];
        s->stop_len[s->n_stop++] = strlen(r->stop[i]);
    }
    s->logprobs = r->logprobs;
    s->top_logprobs = r->top_logprobs;
    s->json_object = r->json_object;
    s->grammar_on_brace = r->tool_choice == SVC_TOOL_CHOICE_AUTO;
    /* Each answer's course through a call (tool_stream.h), from its start. */
    j->tools = r->tool_choice != SVC_TOOL_CHOICE_NONE;
    j->tool_call = r->tool_choice != SVC_TOOL_CHOICE_AUTO;
    if (j->tools)
        job_choices_reset(j);
    _Static_assert(SVC_LOGIT_BIAS_MAX <= ML_SAMPLE_MAX_BIAS, "j->logit_bias holds them all");
    for (size_t i = 0; i < r->sampling.n_logit_bias; i++)
        j->logit_bias[i] = (ml_logit_bias){r->sampling.logit_bias[i].id,
                                           r->sampling.logit_bias[i].bias};
    s->logit_bias = j->logit_bias;
    s->n_logit_bias = r->sampling.n_logit_bias;
}

/* Which of tools[] a call may make (all, or the named one), whose own
 * parameters schema to blame for an error of the call's. */
static bool tool_allowed(const svc_request *r, size_t i)
{
    return r->tool_choice != SVC_TOOL_CHOICE_FUNCTION || i == r->tool_named;
}

/* The call schema of r's tools did not compile (err): name the tool whose
 * parameters are to blame, compiling each on its own (only on this error
 * path), or the call schema as a whole when none fails alone (a bound
 * the union went over). */
static void blame_tool(svc_worker *w, const svc_request *r, const char *err, char *msg,
                       size_t msglen)
{
    for (size_t i = 0; i < r->n_tools; i++) {
        svc_span fn = svc_json_member(svc_json_value(r->tools[i].json, r->tools[i].json_len),
                                      "function");
        svc_span params = svc_json_is(fn, '{') ? svc_json_member(fn, "parameters") : fn;
        char one[SVC_ERRMSG_MAX];
        ml_grammar *g = NULL;
        svc_schema_lookup info;
        if (!tool_allowed(r, i) || !params.p ||
            svc_schema_cache_get(w->schemas, params.p, params.n, SVC_TOOL_CALL_MAX_WHITESPACE, &g,
                                 &info, one, sizeof one) ==
                ML_OK) {
            ml_grammar_unref(g);
            continue;
        }
        svc_errf(msg, msglen, "tools[%zu].function.parameters: %s", i, one);
        return;
    }
    svc_errf(msg, msglen, "tools: the schema of a call: %s", err);
}

/* response_format json_schema, or the schema of a tool call: the grammar
 * from the worker's cache, or compiled here (never on the step thread,
 * whose step would wait for it), into j->sampling.grammar (j's reference,
 * released by job_free). What the compiler cannot enforce exactly is
 * refused with its message, which names the keyword and its JSON Pointer,
 * or the bound it went over. */
static svc_error prepare_schema(svc_worker *w, job *j, char *msg, size_t msglen)
{
    const svc_request *r = j->req;
    const char *text = r->json_schema ? r->json_schema : r->tool_call_schema;
    size_t len = r->json_schema ? r->json_schema_len : r->tool_call_schema_len;
    if (!text)
        return SVC_ERROR_NONE;
    char err[SVC_ERRMSG_MAX];
    svc_schema_lookup info;
    uint32_t ws = r->json_schema ? 0 : SVC_TOOL_CALL_MAX_WHITESPACE;
    ml_status st = svc_schema_cache_get(w->schemas, text, len, ws, &j->sampling.grammar, &info,
                                        err, sizeof err);
    if (st != ML_OK) {
        if (r->json_schema)
            svc_errf(msg, msglen, "response_format.json_schema.schema: %s", err);
        else
            blame_tool(w, r, err, msg, msglen);
        return st == ML_ERR_NOMEM ? SVC_ERROR_INTERNAL : SVC_ERROR_INVALID_REQUEST;
    }
    if (info.hit) {
        svc_metrics_add(SVC_COUNTER_SCHEMA_CACHE_HITS, 1);
    } else {
        svc_metrics_add(SVC_COUNTER_SCHEMA_COMPILES, 1);
        svc_metrics_observe(SVC_HIST_SCHEMA_COMPILE, info.compile_s);
    }
    size_t entries, bytes;
    svc_schema_cache_usage(w->schemas, &entries, &bytes);
    svc_metrics_set(SVC_GAUGE_SCHEMA_CACHE_BYTES, (double)bytes);
    return SVC_ERROR_NONE;
}

/* A job back from the step thread: the runtime ended it with
 * ML_REQERR_IMAGE_EVICTED, an inline image whose decoding prepare_images
 * skipped having lost its state between this prep and the admission
 * (on_finish, worker_step.c). The step thread decodes nothing; here every
 * image is decoded, as for a worker that never held them, and the job is
 * submitted again, to wait its turn in the runtime anew. Attempt, prompt,
 * sampling and reply state are as the first prep left them: nothing was
 * generated. */
static void redecode(svc_worker *w, job *j)
{
    char msg[SVC_ERRMSG_MAX];
    svc_metrics_add(SVC_COUNTER_IMAGE_LATE_DECODES, (uint64_t)j->n_skipped);
    j->n_skipped = 0;
    svc_error code = prepare_images(w, j, msg, sizeof msg);
    j->redecode = false;
    if (code != SVC_ERROR_NONE) {
        worker_reply_error(w, j, code, msg);
        return;
    }
    job_queue_push(&w->step_q, j);
}

/* A number for an execution Redis could not count: it may be a
 * re-execution all the same, so it must not reuse the number of an earlier
 * attempt, whose seqs it would repeat. */
static uint32_t uncounted_attempt(svc_worker *w)
{
    return WORKER_ATTEMPT_UNCOUNTED |
           (atomic_fetch_add(&w->next_uncounted, 1) & ~WORKER_ATTEMPT_UNCOUNTED);
}

/* The attempt a reply carries: executions of the request id in its tenant,
 * counted in Redis, so a client's retry under the same id (another record)
 * is a new, higher attempt, as a redelivery of the same record is; the
 * per-offset count stays the poison-message guard. Once the request has
 * parsed, before any reply. */
static void count_attempt_by_id(svc_worker *w, job *j)
{
    if (prep_redis) {
        uint32_t attempt;
        svc_watch_begin(prep_watch, "redis request attempts");
        svc_redis_status rs =
            svc_redis_request_attempt_incr(prep_redis, j->tenant->name, j->id, &attempt);
        svc_watch_begin(prep_watch, "prepare");
        if (rs == SVC_REDIS_OK) {
            j->attempt = attempt;
            return;
        }
        svc_metrics_add(SVC_COUNTER_REDIS_ERRORS, 1);
    }
    if (!(j->attempt & WORKER_ATTEMPT_UNCOUNTED))
        j->attempt = uncounted_attempt(w);
}

/* Poison messages: count this execution of the record. Returns false when
 * the record was consumed limits.max_attempts times already (j is then
 * dead-lettered). Only records that parsed are counted, so junk leaves
 * nothing in Redis; what can crash a worker comes after the parse (the
 * parser itself is fuzzed). */
static bool count_attempt_by_offset(svc_worker *w, job *j)
{
    if (!prep_redis)
        return true;
    uint32_t attempt;
    svc_watch_begin(prep_watch, "redis offset attempts");
    svc_redis_status rs =
        svc_redis_attempt_incr(prep_redis, j->topic, j->partition, j->offset, &attempt);
    svc_watch_begin(prep_watch, "prepare");
    if (rs != SVC_REDIS_OK) {
        svc_metrics_add(SVC_COUNTER_REDIS_ERRORS, 1);
        return true;
    }
    j->offset_counted = true;
    if ((int)attempt <= w->cfg.limits.max_attempts)
        return true;
    char msg[SVC_ERRMSG_MAX];
    svc_errf(msg, sizeof msg, "the message was consumed %u times without being answered",
             attempt - 1);
    worker_dead_letter(w, j, SVC_ERROR_TOO_MANY_ATTEMPTS, msg);
    return false;
}

static void prepare(svc_worker *w, job *j)
{
    char msg[SVC_ERRMSG_MAX];
    if (atomic_load(&j->abandoned)) {
        job_free(j);
        return;
    }
    if (j->redecode) {
        redecode(w, j);
        return;
    }
    /* Until the request has parsed and been counted, its number is one no
     * other execution has (an error reply to a request that does not parse
     * carries it). */
    j->attempt = uncounted_attempt(w);

    svc_request_input in = {
        .value = j->msg.value, .value_len = j->msg.value_len,
        .key = j->msg.key, .key_len = j->msg.key_len,
        .request_id = header(j, "request_id"), .reply_topic = header(j, "reply_topic"),
        .deadline_ms = header(j, "deadline_ms"), .traceparent = header(j, "traceparent"),
        .now_ms = svc_wall_ms(),
    };
    svc_error code = svc_request_parse(&in, &w->limits, &j->req, msg, sizeof msg);
    /* A reply topic outside the policy has no allowed address to answer:
     * not even an error reply goes there. */
    const char *topic = j->req ? j->req->reply_topic : NULL;
    if (topic && !svc_reply_topic_allowed(&j->tenant->policy, topic, strlen(topic))) {
        svc_errf(msg, sizeof msg, "reply_topic '%s' is not allowed for tenant %s", topic,
                 j->tenant->name);
        worker_dead_letter(w, j, SVC_ERROR_REPLY_TOPIC_NOT_ALLOWED, msg);
        return;
    }
    if (j->req && j->req->id && j->req->reply_topic &&
        job_identify(w, j, j->req->id, j->req->reply_topic) == 0) {
        j->stream = j->req->stream;
    }
    if (code != SVC_ERROR_NONE || !j->id || !j->reply_topic) {
        if (!j->req || !svc_request_answerable(j->req) || !j->id || !j->reply_topic)
            worker_dead_letter(w, j, code != SVC_ERROR_NONE ? code : SVC_ERROR_INTERNAL,
                               code != SVC_ERROR_NONE ? msg : "out of memory");
        else
            worker_reply_error(w, j, code, msg);
        return;
    }
    if (!count_attempt_by_offset(w, j))
        return;
    count_attempt_by_id(w, j);
    /* The request owns what it uses; of the record, only what a later dead
     * letter needs stays (reply_undeliverable). */
    if (job_choices_init(j, j->req->n) != 0 ||
        svc_kafka_msg_detach(&j->msg, WORKER_LATE_DLT_VALUE_MAX) != SVC_KAFKA_OK) {
        worker_reply_error(w, j, SVC_ERROR_INTERNAL, "out of memory");
        return;
    }
    /* A cancel that came while it was queued: the step thread checks again
     * at submit, for one that comes during the work below. */
    if (worker_job_stopped(w, j)) {
        worker_reply_cancelled(w, j, atomic_load(&j->replaced)
                                         ? "replaced by a newer execution before it was prepared"
                                         : "cancelled before it was prepared");
        return;
    }
    if ((j->req->adapter &&
         (code = ensure_adapter(w, j, msg, sizeof msg)) != SVC_ERROR_NONE) ||
        /* The schema before the images: a refused one costs no decoding. */
        (code = prepare_schema(w, j, msg, sizeof msg)) != SVC_ERROR_NONE ||
        (code = prepare_images(w, j, msg, sizeof msg)) != SVC_ERROR_NONE ||
        (code = build_prompt(w, j, msg, sizeof msg)) != SVC_ERROR_NONE) {
        worker_reply_error(w, j, code, msg);
        return;
    }
    build_sampling(w, j);
    j->t_handoff = svc_now_s();
    job_queue_push(&w->step_q, j);
}

void *worker_prep_main(void *arg)
{
    prep_thread *self = arg;
    svc_worker *w = self->w;
    prep_redis = self->redis;
    prep_watch = &w->health.watch[self - w->prep];
    while (!atomic_load(&w->threads_stop)) {
        job *j = job_queue_pop(&w->prep_q, PREP_POLL_MS);
        if (!j)
            continue;
        svc_watch_begin(prep_watch, "prepare");
        prepare(w, j);
        svc_watch_end(prep_watch);
    }
    return NULL;
}
