/* `mllama run --batch FILE.jsonl`: one request per line, submitted at once
 * or after the line its "after" names, run by continuous batching; one JSON
 * result per request, then the throughput (run_internal.h). */
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
    for (int i = 0; i < n; i++) {
        jobs[i].index = i;
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
    while (rc == 0) {
        rc = submit_ready(c, o, lines, jobs, n);
        if (rc || ml_runtime_active(c->rt) == 0)
            break;
        if (ml_runtime_step(c->rt, err, sizeof err) != ML_OK) {
            fprintf(stderr, CMD ": %s\n", err);
            rc = -1;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double wall = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    long generated = 0, prompt = 0, prompt_cached = 0;
    for (int i = 0; rc == 0 && i < n; i++) {
        run_print_json_line(run_result_json(&jobs[i]));
        generated += jobs[i].usage.completion_tokens;
        prompt += jobs[i].usage.prompt_tokens;
        prompt_cached += jobs[i].usage.prompt_tokens_cached;
    }
    for (int i = 0; i < n; i++)
        run_job_deinit(&jobs[i]);
    free(jobs);
    if (rc == 0) {
        cJSON *agg = cJSON_CreateObject();
        cJSON_AddNumberToObject(agg, "requests", n);
        cJSON_AddNumberToObject(agg, "prompt_tokens", (double)prompt);
        cJSON_AddNumberToObject(agg, "prompt_tokens_cached", (double)prompt_cached);
        cJSON_AddNumberToObject(agg, "completion_tokens", (double)generated);
        cJSON_AddNumberToObject(agg, "wall_s", wall);
        cJSON_AddNumberToObject(agg, "completion_tokens_per_s", wall > 0 ? generated / wall : 0);
        cJSON *wrap = cJSON_CreateObject();
        cJSON_AddItemToObject(wrap, "aggregate", agg);
        run_print_json_line(wrap);
    }
    return rc;
}
