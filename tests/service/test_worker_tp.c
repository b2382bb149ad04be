/* Tensor parallelism as a configuration of the product, on the CPU:
 * - the worker configuration refuses model.tensor_parallel 0, negative or
 *   above the limit and a device list that does not match it, each naming
 *   the key, and takes adapter slots on a split model;
 * - `mllama run --tp 2` on a golden fixture gives the output ids of
 *   --tp 1; --tp 3 (which does not divide the fixture's heads), --tp 0 and
 *   a device list of the wrong length are refused, saying why;
 * - `mllama worker` with model.tensor_parallel=3 on the tiny model exits
 *   with the model-load code, and with a bad value with the config code;
 * - `mllama worker` with model.tensor_parallel=2 (the tiny model, a mock
 *   Kafka cluster, no Redis) logs the split and its cross-attention row
 *   mask (reference, the default; also in mllama_model_info), answers a
 *   chat request with the text `mllama run --tp 1` generates for the same
 *   prompt and date, and drains on SIGTERM with exit code 0 and no
 *   sanitizer report. */
#include "proc_util.h"

#include "cli/commands.h"
#include "config.h"
#include "worker/worker.h"

#define FIXTURE ML_SOURCE_DIR "/tests/golden/fixtures/models/m7_sharded"
#define TOPICS PU_REQUESTS ":2," PU_REPLIES ":2," PU_DLT ":1," PU_CANCEL ":1"
#define ANSWER_MS 60000 /* the tiny model's first request, from produce to final record */
#define MAX_TOKENS 8
#define PROMPT "Hello there."
/* The template's date in both prompts: the same whatever day the test runs. */
#define DATE "26 Jul 2024"

static char dir[PU_PATH_MAX], model[PU_PATH_MAX + 16], brokers[256];
static pu_proc kafka, worker;

static void cleanup(void)
{
    pu_kill(&worker);
    pu_kill(&kafka);
    pu_tmpdir_done(dir);
}

/* ---- configuration ------------------------------------------------------------------- */

/* svc_config_load with the given overrides must fail naming `needle`. */
static void config_refused(const char *const *sets, size_t n, const char *needle)
{
    svc_config cfg;
    char err[512] = "";
    int rc = svc_config_load(&cfg, NULL, sets, n, err, sizeof err);
    check(rc == -1 && strstr(err, needle), "%s%s refused naming %s: %s", sets[0],
          n > 1 ? " (and more)" : "", needle, rc ? err : "accepted");
    svc_config_deinit(&cfg);
}

static void test_config(void)
{
    static const char *const zero[] = {"model.tensor_parallel=0"};
    static const char *const negative[] = {"model.tensor_parallel=-2"};
    static const char *const huge[] = {"model.tensor_parallel=65"};
    static const char *const word[] = {"model.tensor_parallel=two"};
    static const char *const adapters[] = {"model.tensor_parallel=2", "runtime.max_adapters=3"};
    static const char *const devices[] = {"model.tensor_parallel=2", "runtime.max_adapters=0",
                                          "model.devices=0,1,2"};
    static const char *const bad_list[] = {"model.devices=0,x"};
    static const char *const twice[] = {"model.tensor_parallel=2", "runtime.max_adapters=0",
                                        "model.devices=1,1"};
    config_refused(zero, 1, "model.tensor_parallel");
    config_refused(negative, 1, "model.tensor_parallel");
    config_refused(huge, 1, "model.tensor_parallel");
    config_refused(word, 1, "model.tensor_parallel");
    config_refused(devices, 3, "model.devices");
    config_refused(bad_list, 1, "model.devices");
    config_refused(twice, 3, "listed twice");

    static const char *const good[] = {"model.tensor_parallel=4", "runtime.max_adapters=0",
                                       "model.devices=3,2,1,0"};
    svc_config cfg;
    char err[512] = "";
    check(svc_config_load(&cfg, NULL, good, 3, err, sizeof err) == 0 &&
              cfg.model.tensor_parallel == 4,
          "tensor_parallel 4 on devices 3,2,1,0: %s", err);
    svc_config_deinit(&cfg);
    check(svc_config_load(&cfg, NULL, adapters, 2, err, sizeof err) == 0 &&
              cfg.model.tensor_parallel == 2 && cfg.runtime.max_adapters == 3,
          "adapter slots on a split model: %s", err);
    svc_config_deinit(&cfg);
    check(svc_config_load(&cfg, NULL, NULL, 0, err, sizeof err) == 0 &&
              cfg.model.tensor_parallel == 1 && !cfg.model.devices[0],
          "the default is one device: %s", err);
    svc_config_deinit(&cfg);
}

/* ---- mllama run ---------------------------------------------------------------------- */

/* `mllama run` on the fixture with `args`; its output ids as text ("[...]"),
 * malloc'd, or NULL on failure (exit code in *code, output in *out). */
static char *run_ids(const char *args, int *code, char **out)
{
    char cmd[2 * PU_PATH_MAX];
    snprintf(cmd, sizeof cmd,
             PU_MLLAMA " run --model " FIXTURE " --ids 1,2,3,4,5,6 --max-tokens %d --json "
                       "--threads 2 %s 2>&1",
             MAX_TOKENS, args);
    *out = pu_shell(cmd, code);
    cJSON *j = *out && *code == 0 ? cJSON_Parse(*out) : NULL;
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(j, "output_ids");
    char *s = ids ? cJSON_PrintUnformatted(ids) : NULL;
    cJSON_Delete(j);
    return s;
}

static void test_run(void)
{
    int code = -1;
    char *out1, *out2, *out;
    char *one = run_ids("--tp 1", &code, &out1);
    check(one != NULL, "run --tp 1: exit %d: %s", code, out1 ? out1 : "");
    char *two = run_ids("--tp 2", &code, &out2);
    check(two != NULL, "run --tp 2: exit %d: %s", code, out2 ? out2 : "");
    check(one && two && !strcmp(one, two), "run --tp 2 gives %s, --tp 1 %s", two ? two : "-",
          one ? one : "-");
    fprintf(stderr, "run: --tp 1 and --tp 2 output ids %s\n", two ? two : "-");
    free(one);
    free(two);
    free(out1);
    free(out2);

    static const struct {
        const char *args, *needle;
        int code;
    } refused[] = {
        {"--tp 3", "does not divide into 3 shards", SVC_EXIT_FAILURE},
        {"--tp 0", "--tp", SVC_EXIT_USAGE},
        {"--tp 2 --devices 0", "1 devices listed", SVC_EXIT_FAILURE},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        char *ids = run_ids(refused[i].args, &code, &out);
        check(!ids && code == refused[i].code && out && strstr(out, refused[i].needle),
              "run %s: exit %d (want %d), output: %s", refused[i].args, code, refused[i].code,
              out ? out : "");
        free(ids);
        free(out);
    }
}

/* ---- mllama worker ------------------------------------------------------------------- */

/* A worker that must exit at start with `want`, its log holding `needle`. */
static void worker_refused(const char *set, int want, const char *needle)
{
    char log[PU_PATH_MAX + 32], dir_set[PU_PATH_MAX + 32];
    snprintf(log, sizeof log, "%s/refused.log", dir);
    snprintf(dir_set, sizeof dir_set, "model.dir=%s", model);
    remove(log);
    char *argv[] = {PU_MLLAMA, "worker", "--set", dir_set, "--set", "http.listen=127.0.0.1:0",
                    "--set", "runtime.max_adapters=0", "--set", (char *)set, NULL};
    int code = pu_run(argv, log, PU_START_MS);
    check(code == want && pu_file_count(log, needle) > 0, "worker %s: exit %d (want %d)", set,
          code, want);
    if (code != want)
        pu_show_log(log, 2000);
    pu_check_log_clean(log);
}

/* The text `mllama run --tp 1` generates for PROMPT (malloc'd) or NULL. */
static char *reference_text(void)
{
    char cmd[2 * PU_PATH_MAX];
    snprintf(cmd, sizeof cmd,
             PU_MLLAMA " run --model %s --chat '" PROMPT "' --date-string '" DATE "' "
                       "--max-tokens %d --json --threads 1",
             model, MAX_TOKENS);
    return pu_run_text(cmd);
}

static void test_worker(void)
{
    worker_refused("model.tensor_parallel=0", SVC_WORKER_EXIT_CONFIG, "model.tensor_parallel");
    worker_refused("model.tensor_parallel=3", SVC_WORKER_EXIT_MODEL, "does not divide");

    char *want = reference_text();
    pu_worker_env env = {brokers, "", model, dir};
    static const char *const extra[] = {"model.tensor_parallel=2", "runtime.max_adapters=0",
                                        NULL};
    if (!pu_worker_start(&worker, &env, "tp2", extra))
        pu_die("worker start");
    check(pu_file_count(worker.log, "\"tensor_parallel\"") == 1 &&
              pu_file_count(worker.log, "on cpu x2") == 1,
          "the worker logs its split over 2 devices");
    check(pu_file_count(worker.log, "cross_attention_row_mask reference)") == 1,
          "the worker logs its row mask at start");
    char *metrics = pu_http_get(pu_worker_http_port(&worker), "/metrics");
    check(metrics && strstr(metrics, "cross_attention_row_mask=\"reference\"} 1"),
          "mllama_model_info carries the row mask");
    free(metrics);

    const char *topics[] = {PU_REPLIES};
    pu_client client;
    pu_client_init(&client, brokers, topics, 1);
    char extra_body[160];
    snprintf(extra_body, sizeof extra_body,
             "\"max_tokens\":%d,\"temperature\":0,\"stream\":false,\"date_string\":\"" DATE
             "\"",
             MAX_TOKENS);
    char *body = pu_chat_request("tp-1", PROMPT, NULL, extra_body);
    check(pu_client_send(&client, "tp-1", body), "tp-1: produce");
    const pu_record *f = pu_client_wait(&client, "tp-1", ANSWER_MS);
    check(f != NULL, "tp-1: no final record within %d ms", ANSWER_MS);
    pu_check_stream(&client, "tp-1");
    cJSON *j = f ? pu_json(f) : NULL;
    const char *reason = pu_finish_reason(j);
    const char *text = pu_json_str(j, PU_PATH("choices", "0", "message", "content"));
    check(reason && (!strcmp(reason, "length") || !strcmp(reason, "stop")),
          "tp-1: finish_reason %s", reason ? reason : "(none)");
    check(want && text && !strcmp(text, want),
          "tp-1: the split worker answers '%s', mllama run --tp 1 '%s'", text ? text : "-",
          want ? want : "-");
    fprintf(stderr, "worker --tp 2: '%s'\n", text ? text : "-");
    cJSON_Delete(j);
    free(body);
    free(want);
    pu_client_deinit(&client);

    int code = pu_stop(&worker, PU_STOP_MS);
    check(code == 0, "tp2: exit code %d after SIGTERM", code);
    if (code != 0)
        pu_show_log(worker.log, 3000);
    pu_check_log_clean(worker.log);
}

int main(void)
{
    atexit(cleanup);
    pu_tmpdir("tp", dir);
    test_config();
    test_run();

    snprintf(model, sizeof model, "%s/tiny", dir);
    char log[PU_PATH_MAX + 32];
    snprintf(log, sizeof log, "%s/mkmodel.log", dir);
    char *mk[] = {PU_MLLAMA, "mkmodel", "--preset", "tiny", "--out", model, NULL};
    if (pu_run(mk, log, PU_START_MS) != 0 ||
        !pu_mock_kafka_start(&kafka, dir, TOPICS, brokers, sizeof brokers))
        pu_die("setup");
    test_worker();
    return check_done();
}
