/* `mllama run`: generate from a model directory through the runtime, for
 * one prompt (text streamed to stdout) or a JSONL batch of requests
 * (continuous batching; per-request results and throughput; cmd_run_batch.c),
 * on one backend or split over a tensor-parallel group (--tp). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/run_internal.h"
#include "engine.h"
#include "protocol/protocol.h"

#define MAX_IMAGE_FILE_BYTES (64u << 20)
#define MAX_RESPONSE_FORMAT_BYTES (64u << 20)
#define DEFAULT_KV_MIB 512
#define MIB (1u << 20)

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mllama run --model DIR [--image FILE]... (--prompt TEXT | --chat TEXT | --ids 1,2,3)\n"
            "                  [--max-tokens N] [--temperature T] [--top-p P] [--top-k K] [--min-p P]\n"
            "                  [--seed S] [--stop STR]... [--json-object | --response-format FILE]\n"
            "                  [--logits-out F.npy] [--json]\n"
            "                  [--threads N] [--kv-mib N] [--image-mib N] [--backend auto|cpu|cuda]\n"
            "                  [--tp N [--devices 0,1,...]] [--cross-attention-row-mask MODE]\n"
            "                  [--date-string DATE] [--batch-invariant on|off] [--no-prefix-cache]\n"
            "                  [--weights stored|fp8] [--fp8-activations bf16|fp8] [--fp8-lm-head]\n"
            "                  [--cpu-activations f32|bf16] [--cpu-kv-cache f32|bf16] [--memory-plan]\n"
            "       mllama run --model DIR --batch FILE.jsonl [--threads N] [--kv-mib N] [--image-mib N]\n"
            "                  [--backend auto|cpu|cuda] [--tp N [--devices 0,1,...]]\n"
            "                  [--cross-attention-row-mask MODE] [--date-string DATE]\n"
            "                  [--batch-invariant on|off] [--no-prefix-cache] [--weights stored|fp8]\n"
            "                  [--fp8-activations bf16|fp8] [--fp8-lm-head]\n"
            "                  [--cpu-activations f32|bf16] [--cpu-kv-cache f32|bf16] [--weights-read]\n\n"
            "--prompt is raw text (special tokens parsed; <|begin_of_text|> is inserted after\n"
            "any leading <|image|> tokens when absent, as MllamaProcessor does); --chat wraps\n"
            "TEXT and the images in the Llama 3.2 Vision Instruct template, TEXT encoded as\n"
            "text as the worker does (special-token text in it stays text); --ids gives token\n"
            "ids. Greedy unless --temperature > 0. Text streams to stdout; --json prints one\n"
            "JSON object with prompt/output ids, text and timings instead. --json-object is\n"
            "JSON mode: the answer is kept one JSON object and ends when it is complete.\n"
            "--response-format FILE: a request's response_format object, e.g.\n"
            "{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\", \"schema\": {...}}}, checked\n"
            "and compiled as the worker does (a schema it refuses is refused here, with the\n"
            "same message), so a schema can be tried locally.\n"
            "--weights fp8 quantizes a bf16 checkpoint's text-decoder Linears to FP8 at load\n"
            "(as the worker's model.weights); a compressed-tensors FP8 checkpoint loads as\n"
            "stored either way. --fp8-activations fp8 (the worker's model.fp8_activations):\n"
            "W8A8, the FP8 Linears quantize their activations per token as vLLM does; the\n"
            "default bf16 keeps them in f32 (W8A16, transformers' decompressed numerics;\n"
            "rounded to bf16 under --cpu-activations bf16).\n"
            "--fp8-lm-head (the worker's model.fp8_lm_head): lm_head FP8 too, quantized at\n"
            "load when the checkpoint keeps it bf16 as the published FP8 ones do; needs FP8\n"
            "weights.\n"
            "--cpu-activations bf16 (the worker's model.cpu_activations): the CPU backend's\n"
            "Linears, bf16 and FP8, round their inputs to bf16 and use AVX-512 BF16 dot\n"
            "products, at the accuracy engine/cpu/README.md states: about 1.6x the GEMM rate\n"
            "on AMD Zen 4/5, about 0.5x on Intel Xeons whose dot product issues at half the\n"
            "FMA rate (config/README.md); the default f32 is the reference. Refused on a CPU\n"
            "without AVX-512 BF16.\n"
            "--cpu-kv-cache bf16 (the worker's model.cpu_kv_cache): the CPU backend stores the\n"
            "K/V caches and the images' cross-attention states in bf16, half the memory per\n"
            "cached token and per image (twice the tokens in --kv-mib), at the rounding of\n"
            "every cached K and V; any CPU, independent of --cpu-activations. The default f32\n"
            "is the reference. The CUDA backend keeps them bf16 always.\n"
            "--memory-plan prints one device's memory plan at load to stderr: weights by\n"
            "dtype, the K/V pool and image states of --kv-mib / --image-mib, the workspaces,\n"
            "what is left and the most K/V tokens or images that would fit.\n"
            "--cross-attention-row-mask: reference (the default: Meta's model, vLLM, SGLang;\n"
            "a text row before its first image gets nothing from cross-attention) or\n"
            "transformers (transformers 4.47: such a row adds attention spread evenly over\n"
            "the images). --date-string: the Instruct template's \"Today Date\" for --chat\n"
            "(default: today's date in UTC, e.g. \"01 Dec 2026\"); the template writes it only\n"
            "into prompts without images.\n"
            "--batch: one JSON object per line with \"prompt\", \"chat\" or \"ids\", optional\n"
            "\"images\" (paths), \"max_tokens\", \"temperature\", \"top_p\", \"top_k\", \"min_p\",\n"
            "\"seed\", \"stop\", \"logit_bias\" (OpenAI's), \"json_object\" (true: JSON mode),\n"
            "\"ignore_eos\" (true: the model's end tokens do not end the request, as vLLM's\n"
            "ignore_eos: for benchmarks), \"date_string\" (as --date-string, which it\n"
            "overrides), and \"after\": the 0-based index of an earlier line, to submit this\n"
            "request only once that one has finished (e.g. an image-cache hit after a miss);\n"
            "the others are submitted at once. Prints one JSON result per request and the\n"
            "throughput, with the steps that only decoded by how many sequences they decoded\n"
            "(\"decode_steps\": count, median, min, max ms). \"warm_up\": true marks a request\n"
            "that warms the process up (its K/V pages, caches): the aggregate counts the other\n"
            "requests and the steps from when every warm-up request has finished.\n"
            "Requests share the K/V of full blocks of a common prompt prefix (the prefix\n"
            "cache: usage.prompt_tokens_cached of each result); --no-prefix-cache turns it\n"
            "off, for A/B comparisons.\n"
            "--weights-read (CPU backend, no --tp): once the batch is done, the aggregate adds\n"
            "\"weights_read\": the bytes of every packed Linear and the best of 3 streaming reads\n"
            "of them (\"bytes\", \"ms\", \"gb_per_s\"), the read bandwidth a memory-bound decode\n"
            "step of this process can reach (tests/bench/roofline.sh bounds its steps with it).\n"
            "--tp N splits the model over N devices (tensor parallelism: N must divide the\n"
            "attention heads, K/V heads and MLP widths): N CPU backends sharing --threads, or\n"
            "the CUDA devices of --devices (default: the first N). --kv-mib and --image-mib\n"
            "are per device.\n"
            "--batch-invariant on: CUDA kernels whose result for a request does not depend on\n"
            "the others in the batch (a seeded request samples the same tokens alone and in a\n"
            "batch; runtime.batch_invariant of the worker). Default off. The CPU backend is\n"
            "batch invariant always.\n");
}

/* ---- what to generate -------------------------------------------------------------- */

/* s may be NULL when n is 0 (a request that ends before its first token). */
static int append_text(run_job *j, const char *s, size_t n)
{
    if (n == 0)
        return 0;
    if (j->text_len + n + 1 > j->text_cap) {
        size_t cap = (j->text_len + n + 1) * 2;
        char *t = realloc(j->text, cap);
        if (!t)
            return -1;
        j->text = t;
        j->text_cap = cap;
    }
    memcpy(j->text + j->text_len, s, n);
    j->text_len += n;
    j->text[j->text_len] = 0;
    if (j->stream) {
        fwrite(s, 1, n, stdout);
        fflush(stdout);
    }
    return 0;
}

/* ---- runtime callbacks (step loop = main thread) ----------------------------------- */

/* Installed for --logits-out only: a sequence with a logits callback is
 * sampled on the host from its downloaded row (runtime, samples_on_host),
 * which at 32 sequences of `small` cost a 16 MB copy and a serial sampling
 * pass a step; without one it is sampled where its logits are, as in the
 * worker. */
static void on_logits(void *ctx, const float *logits, int vocab)
{
    run_job *j = ctx;
    if (j->n_logit_rows == j->logit_cap) {
        size_t cap = j->logit_cap ? 2 * j->logit_cap : 64;
        float *l = realloc(j->logits, cap * (size_t)vocab * sizeof *l);
        if (!l)
            return; /* the .npy write reports the shortfall */
        j->logits = l;
        j->logit_cap = cap;
    }
    memcpy(j->logits + j->n_logit_rows++ * (size_t)vocab, logits, (size_t)vocab * sizeof *logits);
}

static void on_token(void *ctx, int32_t id, const char *text, size_t len, const ml_sample_out *lp)
{
    run_job *j = ctx;
    ml_token_buf_push(&j->output, id);
    append_text(j, text, len);
}

static void on_finish(void *ctx, const char *tail, size_t tail_len, ml_finish_reason reason,
                      ml_request_error error, const char *message, const ml_usage *usage)
{
    run_job *j = ctx;
    append_text(j, tail, tail_len);
    j->reason = reason;
    j->error = error;
    snprintf(j->message, sizeof j->message, "%s", message ? message : "");
    j->usage = *usage;
    j->done = 1;
}

static const char *reason_name(ml_finish_reason r)
{
    switch (r) {
    case ML_FINISH_REASON_STOP: return "stop";
    case ML_FINISH_REASON_LENGTH: return "length";
    case ML_FINISH_REASON_CANCELLED: return "cancelled";
    case ML_FINISH_REASON_DEADLINE: return "deadline";
    case ML_FINISH_REASON_ERROR: return "error";
    }
    return "?";
}

/* ---- building a request ------------------------------------------------------------ */

static int parse_ids(const char *s, ml_token_buf *out)
{
    while (*s) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (errno || end == s || v < 0 || v > INT32_MAX) {
            fprintf(stderr, CMD ": --ids: bad token id at '%s'\n", s);
            return -1;
        }
        if (ml_token_buf_push(out, (int32_t)v) != ML_OK)
            return -1;
        s = end;
        if (*s == ',')
            s++;
        else if (*s) {
            fprintf(stderr, CMD ": --ids: expected ',' at '%s'\n", s);
            return -1;
        }
    }
    return 0;
}

/* Raw text: encode with specials parsed; insert <|begin_of_text|> after the
 * leading <|image|> tokens when the text has none (processing_mllama
 * build_string_from_input). */
static int encode_prompt(const run_ctx *c, const char *text, ml_token_buf *out)
{
    char err[256];
    ml_token_buf raw;
    ml_token_buf_init(&raw);
    if (ml_tokenizer_encode(c->tok, text, strlen(text), ML_ENCODE_PARSE_SPECIAL, &raw, err,
                            sizeof err) != ML_OK) {
        fprintf(stderr, CMD ": %s\n", err);
        ml_token_buf_deinit(&raw);
        return -1;
    }
    const ml_config *mc = ml_model_config(c->model);
    int has_bos = 0;
    size_t lead = 0;
    for (size_t i = 0; i < raw.n; i++)
        has_bos |= raw.ids[i] == mc->text.bos_token_id;
    while (lead < raw.n && raw.ids[lead] == mc->image_token_index)
        lead++;
    int rc = 0;
    for (size_t i = 0; i <= raw.n && rc == 0; i++) {
        if (i == lead && !has_bos)
            rc = ml_token_buf_push(out, mc->text.bos_token_id) == ML_OK ? 0 : -1;
        if (i < raw.n && rc == 0)
            rc = ml_token_buf_push(out, raw.ids[i]) == ML_OK ? 0 : -1;
    }
    ml_token_buf_deinit(&raw);
    return rc;
}

/* One user turn: the images, then the text (the model card's layout). The
 * text is message text (ml_chat_encode): unlike --prompt, special-token text
 * in it is not parsed. The date is spec's, else today's in UTC, as the
 * worker writes it. */
static int encode_chat(const run_ctx *c, const job_spec *spec, ml_token_buf *out)
{
    ml_chat_part parts[MAX_IMAGES + 1];
    for (int i = 0; i < spec->n_images; i++)
        parts[i] = (ml_chat_part){.type = ML_CHAT_PART_IMAGE};
    parts[spec->n_images] = (ml_chat_part){.type = ML_CHAT_PART_TEXT, .text = spec->text};
    ml_chat_message msg = {.role = "user", .parts = parts, .n_parts = (size_t)spec->n_images + 1};
    char today[ML_CHAT_DATE_BYTES];
    ml_chat_options opt = {.add_generation_prompt = 1,
                           .date_string = spec->date_string ? spec->date_string
                                                            : ml_chat_date_today(today)};
    char err[256];
    if (ml_chat_encode(c->tok, &msg, 1, &opt, out, err, sizeof err) != ML_OK) {
        fprintf(stderr, CMD ": %s\n", err);
        return -1;
    }
    return 0;
}

/* Decode and preprocess an image file into a request image (pixels owned). */
static int load_image(const run_ctx *c, const char *path, ml_request_image *im)
{
    size_t len;
    char *bytes = svc_read_file(CMD, path, MAX_IMAGE_FILE_BYTES, &len);
    if (!bytes)
        return -1;
    char err[256];
    memset(im, 0, sizeof *im);
    ml_status st = ml_engine_prepare_image(c->engine, (const uint8_t *)bytes, len, im, err,
                                           sizeof err);
    if (st == ML_OK) {
        ml_sha256(bytes, len, im->key);
    } else {
        fprintf(stderr, CMD ": %s: %s\n", path, err);
    }
    free(bytes);
    return st == ML_OK ? 0 : -1;
}

/* Build and submit the request of spec into job. */
int run_submit(run_ctx *c, const job_spec *spec, run_job *j)
{
    int rc = 0;
    if (spec->kind == PROMPT_IDS)
        rc = parse_ids(spec->text, &j->prompt);
    else if (spec->kind == PROMPT_CHAT)
        rc = encode_chat(c, spec, &j->prompt);
    else
        rc = encode_prompt(c, spec->text, &j->prompt);
    if (rc)
        return -1;

    ml_request_image images[MAX_IMAGES];
    int n = 0;
    for (; n < spec->n_images; n++)
        if (load_image(c, spec->images[n], &images[n]))
            break;
    if (n < spec->n_images) {
        for (int i = 0; i < n; i++)
            free(images[i].pixels);
        return -1;
    }
    ml_request req = {
        .prompt = j->prompt.ids,
        .n_prompt = (int)j->prompt.n,
        .images = images,
        .n_images = n,
        .sampling = spec->sampling,
        .cb = {.on_logits = j->collect_logits ? on_logits : NULL,
               .on_token = on_token,
               .on_finish = on_finish,
               .ctx = j},
    };
    uint64_t handle;
    char err[256];
    if (ml_runtime_submit(c->rt, &req, &handle, err, sizeof err) != ML_OK) {
        fprintf(stderr, CMD ": %s\n", err);
        return -1;
    }
    return 0;
}

/* ---- output ------------------------------------------------------------------------ */

static cJSON *ids_json(const ml_token_buf *b)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && i < b->n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(b->ids[i]));
    return a;
}

cJSON *run_result_json(const run_job *j)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "index", j->index);
    if (j->warm_up)
        cJSON_AddTrueToObject(o, "warm_up");
    cJSON_AddItemToObject(o, "prompt_ids", ids_json(&j->prompt));
    cJSON_AddItemToObject(o, "output_ids", ids_json(&j->output));
    cJSON_AddStringToObject(o, "text", j->text ? j->text : "");
    cJSON_AddStringToObject(o, "finish_reason", reason_name(j->reason));
    if (j->reason == ML_FINISH_REASON_ERROR)
        cJSON_AddStringToObject(o, "error", j->message);
    cJSON *t = cJSON_AddObjectToObject(o, "timings");
    const ml_usage *u = &j->usage;
    int decoded = u->completion_tokens > 1 ? u->completion_tokens - 1 : 0;
    cJSON_AddNumberToObject(t, "queue_ms", u->queue_ms);
    cJSON_AddNumberToObject(t, "vision_ms", u->vision_ms);
    cJSON_AddNumberToObject(t, "prefill_ms", u->prefill_ms);
    cJSON_AddNumberToObject(t, "ttft_ms", u->ttft_ms);
    cJSON_AddNumberToObject(t, "decode_ms", u->decode_ms);
    cJSON_AddNumberToObject(t, "ms_per_token", decoded ? u->decode_ms / decoded : 0);
    cJSON *us = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(us, "prompt_tokens", u->prompt_tokens);
    cJSON_AddNumberToObject(us, "prompt_tokens_cached", u->prompt_tokens_cached);
    cJSON_AddNumberToObject(us, "completion_tokens", u->completion_tokens);
    cJSON_AddNumberToObject(us, "images", u->images);
    cJSON_AddNumberToObject(us, "images_cached", u->images_cached);
    return o;
}

void run_print_json_line(cJSON *o)
{
    char *s = cJSON_PrintUnformatted(o);
    if (s)
        printf("%s\n", s);
    free(s);
    cJSON_Delete(o);
}

/* A --date-string or batch "date_string" value: the worker's rule for the request
 * field (svc_valid_date_string), so both refuse the same text. */
int run_check_date_string(const char *what, const char *s)
{
    if (svc_valid_date_string(s, strlen(s)))
        return 0;
    fprintf(stderr, CMD ": %s: expected 1..%d bytes of UTF-8 without control characters, "
                    "e.g. \"26 Jul 2024\"\n", what, SVC_DATE_STRING_MAX);
    return -1;
}

/* ---- --response-format ---------------------------------------------------------------- */

/* The response_format object in path, checked by the worker's own request
 * parser (inside a minimal request) and a json_schema compiled within the
 * worker's default limits, so that a file passes here exactly when a
 * request carrying it passes a worker with the default configuration. Sets
 * p->json_object, or p->grammar (owned by the caller: ml_grammar_unref).
 * Returns 0, or -1 with the parser's or compiler's message printed. */
static int load_response_format(const char *path, ml_sampling_params *p)
{
    size_t len;
    char *format = svc_read_file(CMD, path, MAX_RESPONSE_FORMAT_BYTES, &len);
    if (!format)
        return -1;
    static const char head[] = "{\"id\":\"run\",\"reply_topic\":\"run\",\"messages\":[{\"role\":"
                               "\"user\",\"content\":\"x\"}],\"response_format\":";
    size_t n = sizeof head + len + 1;
    char *body = malloc(n);
    if (!body) {
        free(format);
        fprintf(stderr, CMD ": out of memory\n");
        return -1;
    }
    snprintf(body, n, "%s%s}", head, format);
    free(format);
    svc_limits lim;
    svc_limits_default(&lim);
    lim.max_request_bytes = n;
    lim.max_json_values = SIZE_MAX;
    svc_request_input in = {.value = body, .value_len = strlen(body)};
    svc_request *req = NULL;
    char err[SVC_ERRMSG_MAX];
    int rc = -1;
    if (svc_request_parse(&in, &lim, &req, err, sizeof err) != SVC_ERROR_NONE) {
        fprintf(stderr, CMD ": %s: %s\n", path, err);
    } else if (req->json_schema) {
        ml_schema_limits sl;
        ml_schema_limits_default(&sl);
        sl.max_schema_bytes = lim.max_schema_bytes;
        if (ml_grammar_compile_schema(req->json_schema, req->json_schema_len, &sl, &p->grammar,
                                      err, sizeof err) != ML_OK)
            fprintf(stderr, CMD ": %s: response_format.json_schema.schema: %s\n", path, err);
        else
            rc = 0;
    } else {
        p->json_object = req->json_object;
        rc = 0;
    }
    svc_request_destroy(req);
    free(body);
    return rc;
}

/* ---- the command ------------------------------------------------------------------- */

/* Option a's value v, off or on (svc_parse_choice): a refusal is printed. */
static int run_choice(const char *a, const char *v, const char *off, const char *on, int *is_on)
{
    char err[256];
    if (svc_parse_choice(a, v, off, on, is_on, err, sizeof err) == 0)
        return 0;
    fprintf(stderr, CMD ": %s\n", err);
    return -1;
}

static int parse_args(int argc, char **argv, run_opts *o)
{
    ml_sampling_params_default(&o->spec.sampling);
    o->spec.sampling.temperature = 0;
    o->spec.sampling.max_tokens = DEFAULT_MAX_TOKENS;
    o->kv_mib = DEFAULT_KV_MIB;
    o->backend = "auto";
    o->tp = 1;
    o->row_mask = ml_model_limits_default().row_mask;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long l;
        double d;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(SVC_EXIT_OK);
        }
        if (!strcmp(a, "--json")) {
            o->json = 1;
            continue;
        }
        if (!strcmp(a, "--memory-plan")) {
            o->memory_plan = 1;
            continue;
        }
        if (!strcmp(a, "--no-prefix-cache")) {
            o->no_prefix_cache = 1;
            continue;
        }
        if (!strcmp(a, "--weights-read")) {
            o->weights_read = 1;
            continue;
        }
        if (!strcmp(a, "--fp8-lm-head")) {
            o->fp8_lm_head = 1;
            continue;
        }
        if (!strcmp(a, "--json-object")) {
            if (o->spec.sampling.grammar) {
                fprintf(stderr, CMD ": give --json-object or one --response-format\n");
                return -1;
            }
            o->spec.sampling.json_object = true;
            continue;
        }
        if (!v) {
            fprintf(stderr, CMD ": %s needs a value\n", a);
            return -1;
        }
        i++;
        ml_sampling_params *p = &o->spec.sampling;
        if (!strcmp(a, "--model"))
            o->model_dir = v;
        else if (!strcmp(a, "--batch"))
            o->batch = v;
        else if (!strcmp(a, "--logits-out"))
            o->logits_out = v;
        else if (!strcmp(a, "--response-format")) {
            if (p->json_object || p->grammar) {
                fprintf(stderr, CMD ": give --json-object or one --response-format\n");
                return -1;
            }
            if (load_response_format(v, p))
                return -1;
        }
        else if (!strcmp(a, "--backend"))
            o->backend = v;
        else if (!strcmp(a, "--devices"))
            o->devices = v;
        else if (!strcmp(a, "--weights")) {
            if (run_choice(a, v, "stored", "fp8", &o->quantize_fp8))
                return -1;
        } else if (!strcmp(a, "--fp8-activations")) {
            if (run_choice(a, v, "bf16", "fp8", &o->fp8_activations))
                return -1;
        } else if (!strcmp(a, "--cpu-activations")) {
            if (run_choice(a, v, "f32", "bf16", &o->cpu_bf16_activations))
                return -1;
        } else if (!strcmp(a, "--cpu-kv-cache")) {
            if (run_choice(a, v, "f32", "bf16", &o->cpu_bf16_kv_cache))
                return -1;
        } else if (!strcmp(a, "--cross-attention-row-mask")) {
            if (ml_row_mask_mode_parse(v, &o->row_mask)) {
                fprintf(stderr, CMD ": %s: expected %s or %s, got '%s'\n", a,
                        ml_row_mask_mode_name(ML_ROW_MASK_REFERENCE),
                        ml_row_mask_mode_name(ML_ROW_MASK_TRANSFORMERS), v);
                return -1;
            }
        } else if (!strcmp(a, "--date-string")) {
            if (run_check_date_string(a, v))
                return -1;
            o->spec.date_string = v;
        } else if (!strcmp(a, "--batch-invariant")) {
            if (strcmp(v, "on") && strcmp(v, "off")) {
                fprintf(stderr, CMD ": --batch-invariant: expected on or off, got '%s'\n", v);
                return -1;
            }
            o->batch_invariant = !strcmp(v, "on");
        } else if (!strcmp(a, "--image")) {
            if (o->spec.n_images == MAX_IMAGES) {
                fprintf(stderr, CMD ": at most %d images\n", MAX_IMAGES);
                return -1;
            }
            o->spec.images[o->spec.n_images++] = v;
        } else if (!strcmp(a, "--prompt") || !strcmp(a, "--chat") || !strcmp(a, "--ids")) {
            if (o->spec.kind != PROMPT_NONE) {
                fprintf(stderr, CMD ": give one of --prompt, --chat, --ids\n");
                return -1;
            }
            o->spec.kind = a[2] == 'p' ? PROMPT_TEXT : a[2] == 'c' ? PROMPT_CHAT : PROMPT_IDS;
            o->spec.text = v;
        } else if (!strcmp(a, "--stop")) {
            if (p->n_stop == ML_STOP_MAX_STRINGS) {
                fprintf(stderr, CMD ": at most %d stop strings\n", ML_STOP_MAX_STRINGS);
                return -1;
            }
            p->stop[p->n_stop] = v;
            p->stop_len[p->n_stop++] = strlen(v);
        } else if (!strcmp(a, "--max-tokens")) {
            if (svc_parse_long(CMD, a, v, 1, INT32_MAX, &l))
                return -1;
            p->max_tokens = (uint32_t)l;
        } else if (!strcmp(a, "--top-k")) {
            if (svc_parse_long(CMD, a, v, 0, INT32_MAX, &l))
                return -1;
            p->top_k = (uint32_t)l;
        } else if (!strcmp(a, "--seed")) {
            if (svc_parse_long(CMD, a, v, 0, INT64_MAX, &l))
                return -1;
            p->seed = (uint64_t)l;
        } else if (!strcmp(a, "--threads")) {
            if (svc_parse_long(CMD, a, v, 0, 1024, &l))
                return -1;
            o->threads = (int)l;
        } else if (!strcmp(a, "--tp")) {
            if (svc_parse_long(CMD, a, v, 1, ML_ENGINE_MAX_WORLD, &l))
                return -1;
            o->tp = (int)l;
        } else if (!strcmp(a, "--kv-mib")) {
            if (svc_parse_long(CMD, a, v, 1, 1L << 24, &o->kv_mib))
                return -1;
        } else if (!strcmp(a, "--image-mib")) {
            if (svc_parse_long(CMD, a, v, 1, 1L << 24, &o->image_mib))
                return -1;
        } else if (!strcmp(a, "--temperature")) {
            if (svc_parse_double(CMD, a, v, 0, 100, &d))
                return -1;
            p->temperature = (float)d;
        } else if (!strcmp(a, "--top-p")) {
            if (svc_parse_double(CMD, a, v, 0, 1, &d))
                return -1;
            p->top_p = (float)d;
        } else if (!strcmp(a, "--min-p")) {
            if (svc_parse_double(CMD, a, v, 0, 1, &d))
                return -1;
            p->min_p = (float)d;
        } else {
            fprintf(stderr, CMD ": unknown option %s\n", a);
            return -1;
        }
    }
    if (!o->model_dir || (!o->batch && o->spec.kind == PROMPT_NONE)) {
        usage(stderr);
        return -1;
    }
    if (o->weights_read && !o->batch) {
        fprintf(stderr, CMD ": --weights-read reports in a --batch run's aggregate\n");
        return -1;
    }
    return 0;
}

static void ctx_deinit(run_ctx *c)
{
    ml_engine_close(c->engine);
}

static int ctx_init(run_ctx *c, const run_opts *o, int max_images)
{
    char err[512];
    ml_engine_config ec = {
        .model_dir = o->model_dir,
        .backend = o->backend,
        .world = o->tp,
        .devices = o->devices,
        .threads = o->threads,
        .batch_invariant = o->batch_invariant,
        .cpu_bf16_activations = o->cpu_bf16_activations,
        .cpu_bf16_kv_cache = o->cpu_bf16_kv_cache,
        .limits = ml_model_limits_default(),
        .fallback_tokenizer = ML_DEFAULT_TOKENIZER,
        .runtime = {.kv_bytes = (size_t)o->kv_mib * MIB, .image_bytes = (size_t)o->image_mib * MIB,
                    .prefix_cache = !o->no_prefix_cache},
        .image_states = max_images,
    };
    ec.limits.row_mask = o->row_mask;
    ec.limits.quantize_fp8 = o->quantize_fp8;
    ec.limits.fp8_activations = o->fp8_activations;
    ec.limits.fp8_lm_head = o->fp8_lm_head;
    if (o->logits_out)
        ec.limits.max_logit_rows = ec.limits.max_step_seqs;
    ec.runtime.max_running = ec.limits.max_step_seqs;
    ec.runtime.max_step_tokens = ec.limits.max_step_tokens;
    if (ml_engine_open(&c->engine, &ec, err, sizeof err) != ML_OK) {
        fprintf(stderr, CMD ": %s: %s\n", o->model_dir, err);
        return -1;
    }
    c->model = ml_engine_model(c->engine);
    c->tok = ml_engine_tokenizer(c->engine);
    c->rt = ml_engine_runtime(c->engine);
    if (o->memory_plan) {
        const ml_memory_plan_spec *spec;
        const ml_memory_plan *plan = ml_engine_memory_plan(c->engine, &spec);
        char line[1024];
        fprintf(stderr, CMD ": memory plan: %s\n",
                ml_memory_plan_format(plan, spec, line, sizeof line));
    }
    return 0;
}

static int drain(run_ctx *c)
{
    char err[512];
    while (ml_runtime_active(c->rt) > 0) {
        if (ml_runtime_step(c->rt, err, sizeof err) != ML_OK) {
            fprintf(stderr, CMD ": %s\n", err);
            return -1;
        }
    }
    return 0;
}

void run_job_deinit(run_job *j)
{
    ml_token_buf_deinit(&j->prompt);
    ml_token_buf_deinit(&j->output);
    free(j->text);
    free(j->logits);
}

static int run_single(run_ctx *c, const run_opts *o)
{
    job_spec spec = o->spec;
    ml_engine_add_stop_ids(c->engine, &spec.sampling);
    run_job j = {.stream = !o->json, .collect_logits = o->logits_out != NULL,
                 .vocab = ml_model_config(c->model)->text.vocab_size};
    ml_token_buf_init(&j.prompt);
    ml_token_buf_init(&j.output);
    int rc = run_submit(c, &spec, &j) || drain(c) ? -1 : 0;
    if (rc == 0 && j.stream)
        printf("\n");
    if (rc == 0 && o->json)
        run_print_json_line(run_result_json(&j));
    if (rc == 0 && j.reason == ML_FINISH_REASON_ERROR) {
        fprintf(stderr, CMD ": %s\n", j.message);
        rc = -1;
    }
    if (rc == 0 && o->logits_out) {
        size_t shape[2] = {j.n_logit_rows, (size_t)j.vocab};
        rc = svc_write_npy_f32(CMD, o->logits_out, j.logits, 2, shape);
    }
    run_job_deinit(&j);
    return rc;
}

int cmd_run(int argc, char **argv)
{
    run_opts o = {0};
    if (parse_args(argc, argv, &o)) {
        ml_grammar_unref(o.spec.sampling.grammar);
        return SVC_EXIT_USAGE;
    }

    run_batch_lines batch = {0};
    int max_images = o.spec.n_images, rc = -1;
    if (o.batch && run_batch_read(o.batch, &batch, &max_images)) {
        run_batch_lines_deinit(&batch);
        ml_grammar_unref(o.spec.sampling.grammar);
        return SVC_EXIT_FAILURE;
    }
    run_ctx c = {0};
    if (ctx_init(&c, &o, max_images) == 0)
        rc = o.batch ? run_batch(&c, &o, &batch) : run_single(&c, &o);
    ctx_deinit(&c);
    run_batch_lines_deinit(&batch);
    ml_grammar_unref(o.spec.sampling.grammar);
    return rc ? SVC_EXIT_FAILURE : SVC_EXIT_OK;
}
