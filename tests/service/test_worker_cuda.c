/* `mllama worker` on the CUDA backend, end to end as separate processes
 * (`mllama mock-kafka`, a real redis-server, one worker on the micro model
 * with model.backend=cuda). In the HOST build (MLLAMA_CUDA=HOST) the
 * worker's kernels execute on the host execution model (kernels/README.md),
 * so CI runs the service over the CUDA backend's own code:
 * - the worker reports the backend it runs on (log line, mllama_build_info);
 * - an image request and a text request sent together (one decode batch
 *   of two on the device) are both answered, streamed with contiguous
 *   seqs; the image request's answer is the text `mllama run --backend
 *   cuda` generates for the same prompt, image and date;
 * - a request whose image is not an image gets invalid_image and the
 *   worker goes on;
 * - the image again by {"type":"image","sha256"}: served from the image
 *   states resident on the device (usage.images_cached 1), same answer;
 * - SIGTERM drains with exit code 0 and, in a sanitizer build, no report.
 * Greedy and short: emulated, a micro-model token costs about a second.
 * Skipped (77) without a CUDA device, redis-server or kcat. */
#include "proc_util.h"

#include "mlk_device.h"

#define IMAGE ML_SOURCE_DIR "/tests/golden/fixtures/images/ex_640x480.jpg"
#define TOPICS PU_REQUESTS ":2," PU_REPLIES ":2," PU_DLT ":1," PU_CANCEL ":1"
/* One request from produce to final record: its prefill and MAX_TOKENS
 * steps at a few seconds each when emulated under the sanitizers. */
#define ANSWER_MS (240000 * PU_SLOWDOWN / 4 + 60000)
#define MAX_TOKENS 3
#define PROMPT "What is in this picture?"
/* The template's date in both prompts: the same whatever day the test runs. */
#define DATE "26 Jul 2024"
#define REQUEST_EXTRA "\"temperature\":0,\"date_string\":\"" DATE "\",\"max_tokens\":"

static char dir[PU_PATH_MAX], model[PU_PATH_MAX + 16], brokers[256];
static pu_redis redis;
static pu_proc kafka, worker;
static pu_client client;

static void cleanup(void)
{
    pu_kill(&worker);
    pu_kill(&kafka);
    pu_kill(&redis.proc);
    pu_tmpdir_done(dir);
}

/* The text `mllama run --backend cuda` generates for PROMPT and IMAGE
 * (malloc'd), or NULL. */
static char *reference_text(void)
{
    char cmd[2 * PU_PATH_MAX];
    snprintf(cmd, sizeof cmd,
             PU_MLLAMA " run --model %s --backend cuda --image " IMAGE " --chat '" PROMPT
                       "' --date-string '" DATE "' --max-tokens %d --json --threads 1",
             model, MAX_TOKENS);
    return pu_run_text(cmd);
}

/* The final record of `id` as JSON (NULL when none came), its stream checked. */
static cJSON *answer(const char *id)
{
    const pu_record *f = pu_client_wait(&client, id, ANSWER_MS);
    check(f != NULL, "%s: no final record within %d ms", id, ANSWER_MS);
    pu_check_stream(&client, id);
    return f ? pu_json(f) : NULL;
}

/* The streamed text of `id`: its records' deltas in seq order (malloc'd). */
static char *streamed_text(const char *id)
{
    const pu_record *recs[MAX_TOKENS + 4];
    const size_t n = pu_client_replies(&client, id, recs, sizeof recs / sizeof recs[0]);
    size_t len = 0;
    char *text = calloc(1, 1);
    for (int seq = 0; text && seq < (int)n; seq++)
        for (size_t i = 0; i < n; i++) {
            if (recs[i]->seq != seq)
                continue;
            cJSON *j = pu_json(recs[i]);
            const char *d = pu_json_str(j, PU_PATH("choices", "0", "delta", "content"));
            const size_t dl = d ? strlen(d) : 0;
            char *grown = realloc(text, len + dl + 1);
            if (grown) {
                memcpy(grown + len, d ? d : "", dl + 1);
                len += dl;
            } else {
                free(text);
            }
            text = grown;
            cJSON_Delete(j);
        }
    return text;
}

static const char *reason_of(const cJSON *j)
{
    const char *reason = pu_finish_reason(j);
    return reason ? reason : "(none)";
}

static bool answered(const cJSON *j)
{
    const char *reason = pu_finish_reason(j);
    return reason && (!strcmp(reason, "length") || !strcmp(reason, "stop"));
}

static void test_worker(const uint8_t *image, size_t image_len, const char *image_sha)
{
    char *want = reference_text();
    pu_worker_env env = {brokers, redis.url, model, dir};
    static const char *const extra[] = {"model.backend=cuda", "runtime.max_adapters=0", NULL};
    if (!pu_worker_start(&worker, &env, "cuda", extra))
        pu_die("worker start");
    char *metrics = pu_http_get(pu_worker_http_port(&worker), "/metrics");
    check(metrics && strstr(metrics, "backend=\"cuda\""), "mllama_build_info names the backend");
    free(metrics);
    check(pu_file_count(worker.log, "on cuda") >= 1, "the worker logs the cuda backend");

    char *part = pu_image_part(image, image_len);
    char *image_body = pu_chat_request("cuda-image", PROMPT, part, REQUEST_EXTRA "3");
    char *text_body = pu_chat_request("cuda-text", "Say something.", NULL, REQUEST_EXTRA "3");
    check(pu_client_send(&client, "cuda-image", image_body), "cuda-image: produce");
    check(pu_client_send(&client, "cuda-text", text_body), "cuda-text: produce");
    cJSON *j = answer("cuda-image");
    char *text = streamed_text("cuda-image");
    check(answered(j) && pu_json_num(j, PU_PATH("usage", "images")) == 1,
          "cuda-image: finish_reason %s, usage.images %g", reason_of(j),
          pu_json_num(j, PU_PATH("usage", "images")));
    check(want && text && !strcmp(text, want),
          "cuda-image: the worker streams '%s', mllama run --backend cuda '%s'",
          text ? text : "-", want ? want : "-");
    fprintf(stderr, "worker on cuda: '%s'\n", text ? text : "-");
    cJSON_Delete(j);
    free(text);
    j = answer("cuda-text");
    check(answered(j), "cuda-text: finish_reason %s", reason_of(j));
    cJSON_Delete(j);

    static const char not_jpeg[] = "this is not an image";
    char *bad_part = pu_image_part(not_jpeg, sizeof not_jpeg - 1);
    char *bad_body = pu_chat_request("cuda-bad", PROMPT, bad_part, REQUEST_EXTRA "3");
    check(pu_client_send(&client, "cuda-bad", bad_body), "cuda-bad: produce");
    j = answer("cuda-bad");
    const char *code = pu_error_code(j);
    check(code && !strcmp(code, "invalid_image"), "cuda-bad: error %s", code ? code : "(none)");
    cJSON_Delete(j);

    char ref[160];
    snprintf(ref, sizeof ref, "{\"type\":\"image\",\"sha256\":\"%s\"}", image_sha);
    char *again_body = pu_chat_request("cuda-again", PROMPT, ref, REQUEST_EXTRA "3");
    check(pu_client_send(&client, "cuda-again", again_body), "cuda-again: produce");
    j = answer("cuda-again");
    text = streamed_text("cuda-again");
    check(answered(j) && pu_json_num(j, PU_PATH("usage", "images_cached")) == 1,
          "cuda-again: finish_reason %s, usage.images_cached %g",
          reason_of(j), pu_json_num(j, PU_PATH("usage", "images_cached")));
    check(want && text && !strcmp(text, want),
          "cuda-again: the resident image states answer '%s', the first time '%s'",
          text ? text : "-", want ? want : "-");
    cJSON_Delete(j);
    free(text);

    free(part);
    free(bad_part);
    free(image_body);
    free(text_body);
    free(bad_body);
    free(again_body);
    free(want);

    const int exit_code = pu_stop(&worker, PU_STOP_MS);
    check(exit_code == 0, "cuda: exit code %d after SIGTERM", exit_code);
    if (exit_code != 0)
        pu_show_log(worker.log, 3000);
    pu_check_log_clean(worker.log);
}

int main(void)
{
    if (mlk_device_count() == 0)
        ml_test_skip("no CUDA device");
    if (!pu_which("redis-server") || !pu_which("kcat"))
        ml_test_skip("redis-server or kcat not installed");
    atexit(cleanup);
    pu_micro_stack_start("cuda", dir, model, &redis, &kafka, TOPICS, brokers, sizeof brokers);
    size_t image_len = 0;
    char image_sha[ML_SHA256_HEX_SIZE];
    uint8_t *image = pu_slurp_image(IMAGE, &image_len, image_sha);
    if (!image)
        pu_die("read " IMAGE);
    const char *topics[] = {PU_REPLIES};
    pu_client_init(&client, brokers, topics, 1);
    test_worker(image, image_len, image_sha);
    pu_client_deinit(&client);
    free(image);
    return check_done();
}
