/* The options that change what the model computes or what its prompt says,
 * end to end through `mllama run` (service/cli/cmd_run.c) and the worker:
 * - --cross-attention-row-mask reaches the model: on a golden fixture whose
 *   image is not the first token (m3: rows before the first <|image|>),
 *   transformers gives generate()'s greedy tokens, as the engine did before
 *   the option existed, and reference (the default) gives other tokens; on
 *   a fixture whose image is the first token (m2) both give the same; a
 *   value that is neither is refused naming both;
 * - --date-string pins the Instruct template's "Today Date" (the prompt ids
 *   are ml_chat_encode's with that date), without it the date is today's in
 *   UTC, a batch line's "date_string" overrides the flag, and a date with a
 *   control character is refused;
 * - --cpu-activations bf16 reaches the CPU backend: on a CPU with AVX-512
 *   BF16 it answers the text-only fixture (its greedy agreement with
 *   generate() is reported, not required: tests/golden/README.md states
 *   the accuracy), with the portable kernels (ML_CPU_ISA=plain) and on any
 *   CPU without AVX-512 BF16 the load is refused naming what is missing;
 *   a value that is neither f32 nor bf16 is refused;
 * - --cpu-kv-cache bf16 reaches the CPU backend: it answers the text-only
 *   fixture on every CPU, with the kernels the engine picks and with the
 *   portable ones (ML_CPU_ISA=plain), as it needs no particular ISA (its
 *   greedy agreement with generate() is reported, not required:
 *   tests/golden/README.md states the accuracy); a value that is neither
 *   f32 nor bf16 is refused;
 * - the worker's model.cross_attention_row_mask reaches its model: with
 *   transformers (the micro model, a mock Kafka cluster, no Redis) it logs
 *   the mode and answers an image request with the text `mllama run
 *   --cross-attention-row-mask transformers` gives, which differs from the
 *   reference mode's. */
#include "proc_util.h"
#include "tokenizer_util.h"

#include "cli/commands.h"
#include "engine.h"
#include "engine/fixture_util.h"

#define STEPS 32 /* the fixtures' greedy tokens */
#define TOPICS PU_REQUESTS ":1," PU_REPLIES ":1," PU_DLT ":1," PU_CANCEL ":1"
#define IMAGE ML_SOURCE_DIR "/tests/golden/fixtures/images/tiny_16x16.jpg"
#define QUESTION "What is this?"
#define ANSWER_TOKENS 8
#define ANSWER_MS 60000 /* the first request, from produce to final record */

static char dir[PU_PATH_MAX], model[PU_PATH_MAX + 16], brokers[256];
static pu_proc kafka, worker;

static void cleanup(void)
{
    pu_kill(&worker);
    pu_kill(&kafka);
    pu_tmpdir_done(dir);
}

/* `mllama run ARGS --json`; the parsed JSON of its first line (owned) or NULL,
 * the exit code in *code and the whole output in *out (owned) when out is
 * not NULL. */
static cJSON *run_json(const char *args, int *code, char **out)
{
    char cmd[4 * PU_PATH_MAX];
    if (snprintf(cmd, sizeof cmd, PU_MLLAMA " run --json --threads 1 %s 2>&1", args) >=
        (int)sizeof cmd)
        pu_die("run_json: the command is too long");
    char *s = pu_shell(cmd, code);
    cJSON *j = s && *code == 0 ? cJSON_Parse(s) : NULL;
    if (out)
        *out = s;
    else
        free(s);
    return j;
}

/* The ids of j's array `key` as "a,b,c" into buf. */
static void ids_text(const cJSON *j, const char *key, char *buf, size_t cap)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, key), *v;
    size_t n = 0;
    buf[0] = 0;
    cJSON_ArrayForEach(v, a)
    {
        n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%s%d", n ? "," : "",
                              (int)v->valuedouble);
    }
}

/* ---- the row mask ----------------------------------------------------------------- */

/* A fixture's prompt ids, its images as --image arguments and its greedy
 * tokens, as "a,b,c" strings. */
typedef struct fixture {
    char path[PU_PATH_MAX];
    char ids[4096], images[2 * PU_PATH_MAX], greedy[1024];
} fixture;

static void fixture_load(fixture *f, const char *name, int n_images)
{
    snprintf(f->path, sizeof f->path, "%s/%s", ML_FX_DIR, name);
    char ref[PU_PATH_MAX + 32], err[256];
    snprintf(ref, sizeof ref, "%s/reference.safetensors", f->path);
    ml_safetensors *st = NULL;
    if (ml_safetensors_open(&st, ref, err, sizeof err) != ML_OK)
        ml_test_skip("no golden fixture models");
    size_t n_ids, n_greedy;
    float *ids = ml_fx_f32(st, "input_ids", &n_ids);
    float *greedy = ml_fx_f32(st, "greedy_tokens", &n_greedy);
    if (!ids || !greedy || n_greedy < STEPS)
        pu_die("fixture reference tensors");
    size_t n = 0;
    for (size_t i = 0; i < n_ids; i++)
        n += (size_t)snprintf(f->ids + n, sizeof f->ids - n, "%s%d", i ? "," : "", (int)ids[i]);
    n = 0;
    for (size_t i = 0; i < STEPS; i++)
        n += (size_t)snprintf(f->greedy + n, sizeof f->greedy - n, "%s%d", i ? "," : "",
                              (int)greedy[i]);
    n = 0;
    for (int i = 0; i < n_images; i++)
        n += (size_t)snprintf(f->images + n, sizeof f->images - n, "--image %s/image_b0_n%d.png ",
                              f->path, i);
    free(ids);
    free(greedy);
    ml_safetensors_destroy(st);
}

/* The output ids (malloc'd "a,b,c") of the fixture's prompt under `mode`
 * (NULL: no flag). */
static char *fixture_run(const fixture *f, const char *mode)
{
    char args[8192];
    snprintf(args, sizeof args, "--model %s %s--ids %s --max-tokens %d%s%s", f->path, f->images,
             f->ids, STEPS, mode ? " --cross-attention-row-mask " : "", mode ? mode : "");
    int code = -1;
    char *out = NULL;
    cJSON *j = run_json(args, &code, &out);
    check(j != NULL, "run %s on %s: exit %d: %.500s", mode ? mode : "(default)", f->path, code,
          out ? out : "");
    char ids[1024] = "";
    ids_text(j, "output_ids", ids, sizeof ids);
    cJSON_Delete(j);
    free(out);
    return strdup(ids);
}

static void test_row_mask(void)
{
    fixture late, first;
    fixture_load(&late, "m3_two_images_interleaved", 2);
    fixture_load(&first, "m2_4tiles_cross_first_last", 1);

    char *hf = fixture_run(&late, "transformers");
    char *ref = fixture_run(&late, "reference");
    char *dflt = fixture_run(&late, NULL);
    check(!strcmp(hf, late.greedy), "m3, transformers: %s, generate() %s", hf, late.greedy);
    check(strcmp(ref, late.greedy) != 0,
          "m3, reference: the rows before the first image must change the answer: %s", ref);
    check(!strcmp(dflt, ref), "m3: the default is reference: %s, reference %s", dflt, ref);
    fprintf(stderr, "m3 transformers %s\nm3 reference    %s\n", hf, ref);
    free(hf);
    free(ref);
    free(dflt);

    hf = fixture_run(&first, "transformers");
    ref = fixture_run(&first, "reference");
    check(!strcmp(hf, first.greedy) && !strcmp(ref, first.greedy),
          "m2 (image first): transformers %s, reference %s, generate() %s", hf, ref, first.greedy);
    free(hf);
    free(ref);

    int code = -1;
    char *out = NULL, args[PU_PATH_MAX + 128];
    snprintf(args, sizeof args, "--model %s --ids 1 --cross-attention-row-mask meta", first.path);
    cJSON_Delete(run_json(args, &code, &out));
    check(code == SVC_EXIT_USAGE && out &&
              strstr(out, "--cross-attention-row-mask: expected reference or transformers, got "
                          "'meta'"),
          "a bad mode: exit %d: %s", code, out ? out : "");
    free(out);
}

/* ---- bf16 activations ------------------------------------------------------------- */

#define BF16_REFUSED "bf16 activations need AVX-512 BF16"

static void test_cpu_activations(void)
{
    fixture text;
    fixture_load(&text, "m5_text_only", 0);
    char args[8192];
    snprintf(args, sizeof args, "--model %s --ids %s --max-tokens %d --cpu-activations bf16",
             text.path, text.ids, STEPS);
    int code = -1;
    char *out = NULL;
    cJSON *j = run_json(args, &code, &out);
    if (j) {
        char ids[1024] = "";
        ids_text(j, "output_ids", ids, sizeof ids);
        check(*ids, "bf16 activations: no output ids");
        fprintf(stderr, "m5 bf16 activations %s\nm5 generate()       %s\n", ids, text.greedy);
    } else {
        check(out && strstr(out, BF16_REFUSED), "bf16 activations: exit %d: %s", code,
              out ? out : "");
        fprintf(stderr, "this CPU has no AVX-512 BF16: %s", out ? out : "");
    }
    cJSON_Delete(j);
    free(out);

    char plain[8192 + 32];
    snprintf(plain, sizeof plain, "%s", args);
    setenv("ML_CPU_ISA", "plain", 1);
    out = NULL;
    j = run_json(plain, &code, &out);
    unsetenv("ML_CPU_ISA");
    check(!j && code != 0 && out && strstr(out, BF16_REFUSED) && strstr(out, "plain kernels"),
          "bf16 activations on the portable kernels: exit %d: %s", code, out ? out : "");
    cJSON_Delete(j);
    free(out);

    snprintf(args, sizeof args, "--model %s --ids 1 --cpu-activations fp16", text.path);
    out = NULL;
    cJSON_Delete(run_json(args, &code, &out));
    check(code == SVC_EXIT_USAGE && out &&
              strstr(out, "--cpu-activations: expected f32 or bf16, got 'fp16'"),
          "a bad --cpu-activations: exit %d: %s", code, out ? out : "");
    free(out);
}

/* ---- bf16 K/V cache --------------------------------------------------------------- */

static void test_cpu_kv_cache(void)
{
    fixture text;
    fixture_load(&text, "m5_text_only", 0);
    char args[8192];
    snprintf(args, sizeof args, "--model %s --ids %s --max-tokens %d --cpu-kv-cache bf16",
             text.path, text.ids, STEPS);
    const char *isas[] = {NULL, "plain"};
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        const char *isa = isas[i] ? isas[i] : "default";
        if (isas[i])
            setenv("ML_CPU_ISA", isas[i], 1);
        int code = -1;
        char *out = NULL;
        cJSON *j = run_json(args, &code, &out);
        if (isas[i])
            unsetenv("ML_CPU_ISA");
        char ids[1024] = "";
        if (j)
            ids_text(j, "output_ids", ids, sizeof ids);
        check(j && *ids, "bf16 K/V cache (%s kernels): exit %d: %s", isa, code,
              out ? out : "");
        fprintf(stderr, "m5 bf16 K/V %-7s %s\nm5 generate()       %s\n", isa, ids, text.greedy);
        cJSON_Delete(j);
        free(out);
    }

    snprintf(args, sizeof args, "--model %s --ids 1 --cpu-kv-cache fp16", text.path);
    int code = -1;
    char *out = NULL;
    cJSON_Delete(run_json(args, &code, &out));
    check(code == SVC_EXIT_USAGE && out &&
              strstr(out, "--cpu-kv-cache: expected f32 or bf16, got 'fp16'"),
          "a bad --cpu-kv-cache: exit %d: %s", code, out ? out : "");
    free(out);
}

/* ---- the date --------------------------------------------------------------------- */

/* ml_chat_encode's ids of one user turn `text` with `date`, as "a,b,c". */
static void chat_ids(const ml_tokenizer *tok, const char *text, const char *date, char *buf,
                     size_t cap)
{
    ml_token_buf ids;
    ml_token_buf_init(&ids);
    char err[256];
    if (ml_tok_chat_turn(tok, text, date, &ids, err, sizeof err) != 0)
        pu_die(err);
    size_t n = 0;
    buf[0] = 0;
    for (size_t i = 0; i < ids.n; i++)
        n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%s%d", i ? "," : "", ids.ids[i]);
    ml_token_buf_deinit(&ids);
}

/* The prompt ids (into buf) of `mllama run --chat Hi` with `extra` args. */
static bool chat_prompt(const char *extra, char *buf, size_t cap)
{
    char args[2 * PU_PATH_MAX];
    snprintf(args, sizeof args, "--model %s --chat Hi --max-tokens 1 %s", model, extra);
    int code = -1;
    char *out = NULL;
    cJSON *j = run_json(args, &code, &out);
    check(j != NULL, "run --chat %s: exit %d: %s", extra, code, out ? out : "");
    ids_text(j, "prompt_ids", buf, cap);
    cJSON_Delete(j);
    free(out);
    return j != NULL;
}

static void test_date(void)
{
    char err[256];
    ml_tokenizer *tok = NULL;
    if (ml_tokenizer_load(ML_DEFAULT_TOKENIZER, &tok, err, sizeof err) != ML_OK)
        pu_die(err);
    char got[4096], want[4096], want_after[4096];

    chat_ids(tok, "Hi", "26 Jul 2024", want, sizeof want);
    if (chat_prompt("--date-string '26 Jul 2024'", got, sizeof got))
        check(!strcmp(got, want), "--date-string 26 Jul 2024: %s, want %s", got, want);
    chat_ids(tok, "Hi", "01 Dec 2026", want, sizeof want);
    if (chat_prompt("--date-string '01 Dec 2026'", got, sizeof got))
        check(!strcmp(got, want), "--date-string 01 Dec 2026: %s, want %s", got, want);

    /* Today, in UTC: the date before or after the run (midnight may pass). */
    char today[ML_CHAT_DATE_BYTES];
    chat_ids(tok, "Hi", ml_chat_date_today(today), want, sizeof want);
    bool ran = chat_prompt("", got, sizeof got);
    chat_ids(tok, "Hi", ml_chat_date_today(today), want_after, sizeof want_after);
    check(ran && (!strcmp(got, want) || !strcmp(got, want_after)),
          "no --date-string: %s, want today's (%s) %s", got, today, want_after);

    /* A batch line's date_string wins over the flag; a line without one
     * takes the flag's. */
    char batch[PU_PATH_MAX + 32], args[4 * PU_PATH_MAX];
    snprintf(batch, sizeof batch, "%s/dates.jsonl", dir);
    static const char lines[] = "{\"chat\":\"Hi\",\"max_tokens\":1,\"date_string\":\"02 Jan 2025\"}\n"
                                "{\"chat\":\"Hi\",\"max_tokens\":1}\n";
    if (!pu_write_file(batch, lines, sizeof lines - 1))
        pu_die("batch file");
    snprintf(args, sizeof args, "--model %s --batch %s --date-string '26 Jul 2024'", model, batch);
    int code = -1;
    char *out = NULL;
    cJSON_Delete(run_json(args, &code, &out));
    check(code == 0 && out, "batch: exit %d: %s", code, out ? out : "");
    char *second = out ? strchr(out, '\n') : NULL;
    cJSON *j0 = out ? cJSON_Parse(out) : NULL, *j1 = second ? cJSON_Parse(second + 1) : NULL;
    ids_text(j0, "prompt_ids", got, sizeof got);
    chat_ids(tok, "Hi", "02 Jan 2025", want, sizeof want);
    check(!strcmp(got, want), "batch line 1 (its own date): %s, want %s", got, want);
    ids_text(j1, "prompt_ids", got, sizeof got);
    chat_ids(tok, "Hi", "26 Jul 2024", want, sizeof want);
    check(!strcmp(got, want), "batch line 2 (the flag's date): %s, want %s", got, want);
    cJSON_Delete(j0);
    cJSON_Delete(j1);
    free(out);

    snprintf(args, sizeof args, "--model %s --chat Hi --date-string \"$(printf '26\\tJul')\"",
             model);
    cJSON_Delete(run_json(args, &code, &out));
    check(code == SVC_EXIT_USAGE && out && strstr(out, "--date-string: expected 1..64 bytes"),
          "a date with a tab: exit %d: %s", code, out ? out : "");
    free(out);
    static const char bad[] = "{\"chat\":\"Hi\",\"date_string\":\"\"}\n";
    if (!pu_write_file(batch, bad, sizeof bad - 1))
        pu_die("batch file");
    snprintf(args, sizeof args, "--model %s --batch %s", model, batch);
    cJSON_Delete(run_json(args, &code, &out));
    check(code == SVC_EXIT_FAILURE && out && strstr(out, "batch line 1: \"date_string\""),
          "an empty batch date_string: exit %d: %s", code, out ? out : "");
    free(out);
    ml_tokenizer_destroy(tok);
}

/* ---- the worker ------------------------------------------------------------------- */

/* The greedy answer (malloc'd) of `mllama run` to IMAGE + QUESTION under `mode`. */
static char *run_image_text(const char *mode)
{
    char args[2 * PU_PATH_MAX];
    snprintf(args, sizeof args,
             "--model %s --image " IMAGE " --chat '" QUESTION "' --max-tokens %d "
             "--cross-attention-row-mask %s",
             model, ANSWER_TOKENS, mode);
    int code = -1;
    char *out = NULL;
    cJSON *j = run_json(args, &code, &out);
    const char *text = pu_json_str(j, PU_PATH("text"));
    check(text != NULL, "run --image --chat (%s): exit %d: %s", mode, code, out ? out : "");
    char *s = strdup(text ? text : "");
    cJSON_Delete(j);
    free(out);
    return s;
}

static void test_worker(void)
{
    char *hf = run_image_text("transformers"), *ref = run_image_text("reference");
    check(strcmp(hf, ref) != 0, "the micro model must answer differently in the two modes: '%s'",
          hf);

    if (!pu_mock_kafka_start(&kafka, dir, TOPICS, brokers, sizeof brokers))
        pu_die("mock kafka");
    pu_worker_env env = {brokers, "", model, dir};
    static const char *const extra[] = {"model.cross_attention_row_mask=transformers",
                                        "runtime.max_adapters=0", NULL};
    if (!pu_worker_start(&worker, &env, "row-mask", extra))
        pu_die("worker start");
    check(pu_file_count(worker.log, "cross_attention_row_mask transformers)") == 1,
          "the worker logs its row mask at start");

    const char *topics[] = {PU_REPLIES};
    pu_client client;
    pu_client_init(&client, brokers, topics, 1);
    size_t n;
    char *jpeg = pu_slurp(IMAGE, &n);
    char *part = jpeg ? pu_image_part(jpeg, n) : NULL;
    if (!part)
        pu_die(IMAGE);
    char extra_body[96];
    snprintf(extra_body, sizeof extra_body,
             "\"max_tokens\":%d,\"temperature\":0,\"stream\":false", ANSWER_TOKENS);
    char *body = pu_chat_request("row-mask-1", QUESTION, part, extra_body);
    check(pu_client_send(&client, "row-mask-1", body), "row-mask-1: produce");
    const pu_record *f = pu_client_wait(&client, "row-mask-1", ANSWER_MS);
    check(f != NULL, "row-mask-1: no final record within %d ms", ANSWER_MS);
    cJSON *j = f ? pu_json(f) : NULL;
    const char *text = pu_json_str(j, PU_PATH("choices", "0", "message", "content"));
    check(text && !strcmp(text, hf), "the transformers worker answers '%s', mllama run '%s'",
          text ? text : "-", hf);
    fprintf(stderr, "worker (transformers): '%s'\nrun reference:         '%s'\n",
            text ? text : "-", ref);
    cJSON_Delete(j);
    free(body);
    free(part);
    free(jpeg);
    free(hf);
    free(ref);
    pu_client_deinit(&client);

    int code = pu_stop(&worker, PU_STOP_MS);
    check(code == 0, "row-mask worker: exit code %d after SIGTERM", code);
    pu_check_log_clean(worker.log);
}

int main(void)
{
    atexit(cleanup);
    pu_tmpdir("run-options", dir);
    test_row_mask();
    test_cpu_activations();
    test_cpu_kv_cache();
    snprintf(model, sizeof model, "%s/micro", dir);
    char log[PU_PATH_MAX + 32];
    snprintf(log, sizeof log, "%s/mkmodel.log", dir);
    if (!pu_make_model(model, log))
        pu_die("mkmodel");
    test_date();
    test_worker();
    return check_done();
}
