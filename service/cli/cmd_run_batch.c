/* `mllama run --batch FILE.jsonl`: one request per line, submitted at once
 * or after the line its "after" names, run by continuous batching; one JSON
 * result per request, then the throughput and the decode steps' times by
 * batch size (run_internal.h). Lines marked "warm_up" warm the process up:
 * the aggregate counts the other requests, and the time and the steps from
 * when every warm-up request has finished, so that a benchmark measures
 * steps that write their K/V to pages of the pool already touched, as a
 * worker's steps do once it has served a while (tests/bench/roofline.sh). */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli_util.h"
#include "cli/run_internal.h"
#include "engine.h"

#define MAX_BATCH_FILE_BYTES (256u << 20)
#define FIRST_STEPS_CAP 256

/* The steps that only decoded (no prefill chunk, no image encoded): each
 * one's wall time and how many sequences it decoded. Per-request
 * ms_per_token mixes the steps a request shared with prefills and with
 * batches of other sizes; these are the per-step times of one batch size
 * (tests/bench/roofline.sh). */
typedef struct step_time {
    double ms;
    int seqs;
} step_time;

typedef struct decode_steps {
    step_time *v; /* owned */
    size_t n, cap;
} decode_steps;

static int decode_steps_add(decode_steps *d, int seqs, double ms)
{
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : FIRST_STEPS_CAP;
        step_time *v = realloc(d->v, cap * sizeof *v);
        if (!v) {
            fprintf(stderr, CMD ": out of memory\n");
            return -1;
        }
        d->v = v;
        d->cap = cap;
    }
    d->v[d->n++] = (step_time){.ms = ms, .seqs = seqs};
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Passes of the weights' streaming read; the fastest counts. */
#define WEIGHTS_READ_PASSES 3

/* {"bytes", "ms", "gb_per_s"} of the engine's read of its packed weights
 * (ml_engine_weights_read), all 0 where it reads none (CUDA, --tp). */
static cJSON *weights_read_json(const ml_engine *e)
{
    uint64_t bytes;
    const double s = ml_engine_weights_read(e, WEIGHTS_READ_PASSES, &bytes);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "bytes", (double)bytes);
    cJSON_AddNumberToObject(o, "ms", s * 1e3);
    cJSON_AddNumberToObject(o, "gb_per_s", s > 0 ? (double)bytes / s / 1e9 : 0);
    return o;
}

/* [{"seqs", "steps", "median_ms", "min_ms", "max_ms"}...] by increasing
 * seqs (the lower median of an even count), or NULL out of memory. */
static cJSON *decode_steps_json(const decode_steps *d)
{
    int max_seqs = 0;
    for (size_t i = 0; i < d->n; i++)
        max_seqs = d->v[i].seqs > max_seqs ? d->v[i].seqs : max_seqs;
    double *v = malloc((d->n + 1) * sizeof *v);
    cJSON *a = v ? cJSON_CreateArray() : NULL;
    for (int b = 1; a && b <= max_seqs; b++) {
        size_t n = 0;
        for (size_t i = 0; i < d->n; i++)
            if (d->v[i].seqs == b)
                v[n++] = d->v[i].ms;
        if (n == 0)
            continue;
        qsort(v, n, sizeof *v, cmp_double);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "seqs", b);
        cJSON_AddNumberToObject(o, "steps", (double)n);
        cJSON_AddNumberToObject(o, "median_ms", v[(n - 1) / 2]);
        cJSON_AddNumberToObject(o, "min_ms", v[0]);
        cJSON_AddNumberToObject(o, "max_ms", v[n - 1]);
        cJSON_AddItemToArray(a, o);
    }
    free(v);
    return a;
}

static double ms_between(const struct timespec *a, const struct timespec *b)
{
    return 1e3 * (double)(b->tv_sec - a->tv_sec) + 1e-6 * (double)(b->tv_nsec - a->tv_nsec);
}

int run_batch_read(const char *path, run_batch_lines *out, int *max_images)
{
    size_t len;
    if (!(out->text = svc_read_file(CMD, path, MAX_BATCH_FILE_BYTES, &len)))
        return -1;
    int n = 0;
    for (char *p = out->text; *p; p++)
        n += *p == '\n';
    out->lines = calloc((size_t)n + 2, sizeof *out->lines);
    if (!out->lines) {
        fprintf(stderr, CMD ": out of memory\n");
        return -1;
    }
    for (char *line = strtok(out->text, "\n"); line; line = strtok(NULL, "\n")) {
        if (!*line)
            continue;
        if (!(out->lines[out->n] = cJSON_Parse(line))) {
            fprintf(stderr, CMD ": %s: line %d is not JSON\n", path, out->n + 1);
            return -1;
        }
        const cJSON *ims = cJSON_GetObjectItemCaseSensitive(out->lines[out->n++], "images");
        *max_images += cJSON_GetArraySize(ims);
    }
    return 0;
}

void run_batch_lines_deinit(run_batch_lines *b)
{
    for (int i = 0; b->lines && i < b->n; i++)
        cJSON_Delete(b->lines[i]);
    free(b->lines);
    free(b->text);
}

/* A batch line's "logit_bias" (OpenAI's: token ids as keys, biases as
 * values) into spec->bias; the runtime checks the ids and values. Returns 0,
 * or -1 printed. */
static int bias_from_json(const cJSON *bias, int line, job_spec *spec)
{
    ml_sampling_params *p = &spec->sampling;
    const cJSON *e;
    if (!cJSON_IsObject(bias))
        goto bad;
    cJSON_ArrayForEach(e, bias)
    {
        char *end;
        long id = strtol(e->string, &end, 10);
        if (!cJSON_IsNumber(e) || end == e->string || *end || id < 0 || id > INT32_MAX)
            goto bad;
        if (p->n_logit_bias == ML_SAMPLE_MAX_BIAS) {
            fprintf(stderr, CMD ": batch line %d: \"logit_bias\": more than %d entries\n", line,
                    ML_SAMPLE_MAX_BIAS);
            return -1;
        }
        spec->bias[p->n_logit_bias++] = (ml_logit_bias){(int32_t)id, (float)e->valuedouble};
    }
    p->logit_bias = spec->bias;
    return 0;
bad:
    fprintf(stderr, CMD ": batch line %d: \"logit_bias\" must map token ids to numbers\n", line);
    return -1;
}

/* A batch line as a request: its prompt, images and sampling fields over
 * the defaults already in *spec. Returns 0, or -1 printed. */
static int spec_from_json(const cJSON *o, int line, job_spec *spec)
{
    const char *keys[] = {"prompt", "chat", "ids"};
    const prompt_kind kinds[] = {PROMPT_TEXT, PROMPT_CHAT, PROMPT_IDS};
    for (int k = 0; k < 3; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, keys[k]);
        if (cJSON_IsString(v)) {
            spec->kind = kinds[k];
            spec->text = v->valuestring;
        }
    }
    if (spec->kind == PROMPT_NONE) {
        fprintf(stderr, CMD ": batch line %d: needs a string \"prompt\", \"chat\" or \"ids\"\n",
                line);
        return -1;
    }
    const cJSON *images = cJSON_GetObjectItemCaseSensitive(o, "images"), *im;
    cJSON_ArrayForEach(im, images)
    {
        if (!cJSON_IsString(im) || spec->n_images == MAX_IMAGES) {
            fprintf(stderr, CMD ": batch line %d: \"images\" must be at most %d paths\n", line,
                    MAX_IMAGES);
            return -1;
        }
        spec->images[spec->n_images++] = im->valuestring;
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "date_string");
    if (v) {
        char what[64];
        snprintf(what, sizeof what, "batch line %d: \"date_string\"", line);
        if (!cJSON_IsString(v) || run_check_date_string(what, v->valuestring))
            return -1;
        spec->date_string = v->valuestring;
    }
    ml_sampling_params *p = &spec->sampling;
    if ((v = cJSON_GetObjectItemCaseSensitive(o, "max_tokens")) && cJSON_IsNumber(v))
        p->max_tokens = (uint32_t)v->valuedouble;
    if ((v = cJSON_GetObjectItemCaseSensitive(o, "temperature")) && cJSON_IsNumber(v))
        p->temperature = (float)v->valuedouble;
    if ((v = cJSON_GetObjectItemCaseSensitive(o, "top_p")) && cJSON_IsNumber(v))
        p->top_p = (float)v->valuedouble;
    if ((v = cJSON_GetObjectItemCaseSensitive(o, "top_k")) && cJSON_IsNumber(v))
        p->top_k = (uint32_t)v->valuedouble;
    if ((v = cJSON_GetObjectItemCaseSensitive(o, "min_p")) && cJSON_IsNumber(v))
        p->min_p = (float)v->valuedouble;
    if ((v = cJSON_GetObjectItemCaseSensitive(o, "seed")) && cJSON_IsNumber(v))
        p->seed = (uint64_t)v->valuedouble;
    p->json_object = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "json_object"));
    if ((v = cJSON_GetObjectItemCaseSensitive(o, "logit_bias")) && bias_from_json(v, line, spec))
        return -1;
    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(o, "stop"), *s;
    cJSON_ArrayForEach(s, stop)
    {
        if (cJSON_IsString(s) && p->n_stop < ML_STOP_MAX_STRINGS) {
            p->stop[p->n_stop] = s->valuestring;
            p->stop_len[p->n_stop++] = strlen(s->valuestring);
        }
    }
    return 0;
}

/* A batch line's "after" (absent: -1), which must name an earlier line so
 * that the requests form no cycle. */
static int after_of(const cJSON *o, int index, int *after)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "after");
    *after = -1;
    if (!v)
        return 0;
    double a = cJSON_IsNumber(v) ? v->valuedouble : -1;
    if (!(a >= 0 && a < index) || a != (double)(int)a) {
        fprintf(stderr, CMD ": batch line %d: \"after\" must be the index of an earlier line\n",
                index + 1);
        return -1;
    }
    *after = (int)a;
    return 0;
}

/* Submit every request not yet submitted whose "after" request is done. */
static int submit_ready(run_ctx *c, const run_opts *o, cJSON *const *lines, run_job *jobs,
                        int n)
{
    for (int i = 0; i < n; i++) {
        run_job *j = &jobs[i];
        if (j->submitted || (j->after >= 0 && !jobs[j->after].done))
            continue;
        job_spec spec = {.date_string = o->spec.date_string};
        ml_sampling_params_default(&spec.sampling);
        spec.sampling.temperature = 0;
        spec.sampling.max_tokens = DEFAULT_MAX_TOKENS;
        /* vLLM's ignore_eos, for benchmarks against engines that generate
         * every token asked for: the model's end tokens do not end it. */
        if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(lines[i], "ignore_eos")))
            ml_engine_add_stop_ids(c->engine, &spec.sampling);
        if (spec_from_json(lines[i], i + 1, &spec) || run_submit(c, &spec, j))
            return -1;
        j->submitted = 1;
    }
    return 0;
}

int run_batch(run_ctx *c, const run_opts *o, const run_batch_lines *b)
{
    cJSON *const *lines = b->lines;
    int n = b->n;
    run_job *jobs = calloc((size_t)n + 1, sizeof *jobs);
    if (!jobs)
        return -1;
    int rc = 0;
    int warming = 0; /* warm-up requests not yet finished */
    for (int i = 0; i < n; i++) {
        jobs[i].index = i;
        jobs[i].warm_up = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(lines[i], "warm_up"));
        warming += jobs[i].warm_up;
        ml_token_buf_init(&jobs[i].prompt);
        ml_token_buf_init(&jobs[i].output);
        if (rc == 0)
            rc = after_of(lines[i], i, &jobs[i].after);
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    /* Each "after" names an earlier line, so when nothing is active every
     * request has been submitted: the lowest unsubmitted one would wait
     * for a finished request. */
    char err[512];
    decode_steps steps = {0};
    while (rc == 0) {
        rc = submit_ready(c, o, lines, jobs, n);
        if (rc || ml_runtime_active(c->rt) == 0)
            break;
        ml_runtime_stats before, after;
        struct timespec s0, s1;
        ml_runtime_get_stats(c->rt, &before);
        clock_gettime(CLOCK_MONOTONIC, &s0);
        if (ml_runtime_step(c->rt, err, sizeof err) != ML_OK) {
            fprintf(stderr, CMD ": %s\n", err);
            rc = -1;
            break;
        }
        clock_gettime(CLOCK_MONOTONIC, &s1);
        ml_runtime_get_stats(c->rt, &after);
        /* Every sequence of a decode-only step samples one token. */
        const int decoded = (int)(after.tokens_generated - before.tokens_generated);
        if (!warming && after.prefill_tokens == before.prefill_tokens &&
            after.images_encoded == before.images_encoded && decoded > 0)
            rc = decode_steps_add(&steps, decoded, ms_between(&s0, &s1));
        if (warming) {
            warming = 0;
            for (int i = 0; i < n; i++)
                warming += jobs[i].warm_up && !jobs[i].done;
            if (!warming)
                t0 = s1;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double wall = ms_between(&t0, &t1) / 1e3;
    long generated = 0, prompt = 0, prompt_cached = 0;
    int measured = 0;
    for (int i = 0; rc == 0 && i < n; i++) {
        run_print_json_line(run_result_json(&jobs[i]));
        if (jobs[i].warm_up)
            continue;
        measured++;
        generated += jobs[i].usage.completion_tokens;
        prompt += jobs[i].usage.prompt_tokens;
        prompt_cached += jobs[i].usage.prompt_tokens_cached;
    }
    for (int i = 0; i < n; i++)
        run_job_deinit(&jobs[i]);
    free(jobs);
    if (rc == 0) {
        cJSON *agg = cJSON_CreateObject();
        cJSON_AddNumberToObject(agg, "requests", measured);
        if (measured < n)
            cJSON_AddNumberToObject(agg, "warm_up_requests", n - measured);
        cJSON_AddNumberToObject(agg, "prompt_tokens", (double)prompt);
        cJSON_AddNumberToObject(agg, "prompt_tokens_cached", (double)prompt_cached);
        cJSON_AddNumberToObject(agg, "completion_tokens", (double)generated);
        cJSON_AddNumberToObject(agg, "wall_s", wall);
        cJSON_AddNumberToObject(agg, "completion_tokens_per_s", wall > 0 ? generated / wall : 0);
        cJSON_AddItemToObject(agg, "decode_steps", decode_steps_json(&steps));
        if (o->weights_read)
            cJSON_AddItemToObject(agg, "weights_read", weights_read_json(c->engine));
        cJSON *wrap = cJSON_CreateObject();
        cJSON_AddItemToObject(wrap, "aggregate", agg);
        run_print_json_line(wrap);
    }
    free(steps.v);
    return rc;
}
