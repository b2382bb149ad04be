/* Private to `mllama run` (cmd_run.c: options, one request, the engine;
 * cmd_run_batch.c: JSONL batch files): what a request is, its outcome, and
 * the calls the batch path shares with the single one. @locality: the main
 * thread (the runtime's step loop runs on it). */
#ifndef SVC_CLI_RUN_INTERNAL_H
#define SVC_CLI_RUN_INTERNAL_H

#include <cjson/cJSON.h>

#include "engine.h"

#define CMD "mllama run"
#define MAX_IMAGES 16
#define DEFAULT_MAX_TOKENS 64

/* ---- what to generate ---- */

typedef enum prompt_kind { PROMPT_NONE, PROMPT_TEXT, PROMPT_CHAT, PROMPT_IDS } prompt_kind;

/* One request as given on the command line or on a batch line (borrowed
 * strings). */
typedef struct job_spec {
    prompt_kind kind;
    const char *text;
    const char *date_string;    /* the template's "Today Date" (--chat); NULL = today */
    const char *images[MAX_IMAGES];
    int n_images;
    ml_sampling_params sampling;
    ml_logit_bias bias[ML_SAMPLE_MAX_BIAS]; /* sampling.logit_bias of a batch line */
} job_spec;

/* One request and its outcome. */
typedef struct run_job {
    int index;
    int stream;                 /* print text to stdout as it comes */
    ml_token_buf prompt;        /* owned */
    ml_token_buf output;        /* owned */
    char *text;                 /* owned (text_cap) */
    size_t text_len, text_cap;
    float *logits;              /* owned (n_logit_rows, vocab) when collecting */
    size_t n_logit_rows, logit_cap;
    int collect_logits, vocab;
    int after;                  /* batch: index of the request to wait for, or -1 */
    int warm_up;                /* batch: left out of the aggregate (cmd_run_batch.c) */
    int submitted, done;
    ml_finish_reason reason;
    ml_request_error error;
    char message[256];
    ml_usage usage;
} run_job;

typedef struct run_ctx {
    ml_engine *engine; /* owned */
    ml_model *model;   /* borrowed from engine, as are tok and rt */
    ml_tokenizer *tok;
    ml_runtime *rt;
} run_ctx;

typedef struct run_opts {
    const char *model_dir, *batch, *logits_out, *backend, *devices;
    int json, threads, tp, batch_invariant, no_prefix_cache, memory_plan;
    int weights_read; /* --weights-read: the batch's aggregate gets the CPU's read of its weights */
    long kv_mib, image_mib;
    ml_row_mask_mode row_mask;
    int quantize_fp8; /* --weights fp8 */
    int fp8_activations; /* --fp8-activations fp8 */
    int fp8_lm_head; /* --fp8-lm-head */
    int cpu_bf16_activations; /* --cpu-activations bf16 */
    int cpu_bf16_kv_cache; /* --cpu-kv-cache bf16 */
    job_spec spec;
} run_opts;

/* ---- shared by the single request and the batch (cmd_run.c) ---- */

/* Build and submit the request of spec into job j. Returns 0, or -1 with
 * the error printed. */
int run_submit(run_ctx *c, const job_spec *spec, run_job *j);
/* j's result as one JSON object (ids, text, finish reason, timings, usage). */
cJSON *run_result_json(const run_job *j);
/* Print o on one line and delete it. */
void run_print_json_line(cJSON *o);
/* A --date-string or batch "date_string" value: the worker's rule for the
 * request field, so both refuse the same text. Returns 0, or -1 printed. */
int run_check_date_string(const char *what, const char *s);
void run_job_deinit(run_job *j);

/* ---- batch files (cmd_run_batch.c) ---- */

/* A batch file's lines, parsed. */
typedef struct run_batch_lines {
    char *text;    /* owned: the file */
    cJSON **lines; /* owned (n) */
    int n;
} run_batch_lines;

/* Read and parse the JSONL file at path into *out (blank lines skipped) and
 * add its lines' images to *max_images. Returns 0, or -1 printed; *out is
 * then still to be released (run_batch_lines_deinit). */
int run_batch_read(const char *path, run_batch_lines *out, int *max_images);
void run_batch_lines_deinit(run_batch_lines *b);

/* Run every line of b as a request (each one submitted once the line its
 * "after" names has finished) and print one JSON result per request, then
 * the aggregate throughput. Returns 0 or -1 printed. */
int run_batch(run_ctx *c, const run_opts *o, const run_batch_lines *b);

#endif
