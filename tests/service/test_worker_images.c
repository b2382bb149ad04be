/* Cheap files that are expensive images, against a running `mllama worker`
 * (mock Kafka and redis-server as processes, the micro model):
 *
 * - A request whose images come to more decoded pixels than
 *   limits.max_request_pixels (three 6 KB PNGs of 7071x7071, 150 M pixels
 *   against 100 M) is refused with image_too_large from the headers, before
 *   any is decoded.
 * - A heavy but legal request (two of them, exactly the 100 M budget:
 *   seconds of decoding) does not stall a text request sent while it is
 *   being prepared on the same partition: with worker.prep_threads 2 the
 *   text request is answered in a fraction of the time the heavy one takes
 *   to its first record, where one prep thread made it wait for both
 *   decodes. The two finish out of offset order, and both offsets are
 *   committed all the same.
 * Timing is relative (the text request against the heavy one on the same
 * machine at the same time), so a loaded machine slows both.
 * Skipped (77) without redis-server. */
#include "proc_util.h"

#define TOPICS PU_REQUESTS ":2," PU_REPLIES ":2," PU_DLT ":1," PU_CANCEL ":1"
#define HEAVY_PNG ML_SOURCE_DIR "/tests/engine/fixtures/png_grey1_7071x7071.png"
#define PREP_THREADS 2
#define REQUEST_PIXELS 100000000 /* limits.max_request_pixels: two heavy PNGs, not three */
#define ANSWER_MS 120000         /* the heavy request under ASan on a loaded machine */
#define SETTLE_MS 500            /* the heavy request is consumed and decoding by then */
#define PARTITION 0              /* both requests: prepared out of offset order */
#define STALL_RATIO 2            /* text latency * this < the heavy request's first record */
#define COMMIT_MS 20000
#define GROUP "mllama-workers"   /* config/local.json */

static char dir[PU_PATH_MAX], model[PU_PATH_MAX + 16], brokers[256];
static pu_redis redis;
static pu_proc kafka, worker;
static pu_client client;
static uint8_t *png;
static size_t png_len;

static void cleanup(void)
{
    pu_kill(&worker);
    pu_kill(&kafka);
    pu_kill(&redis.proc);
    pu_tmpdir_done(dir);
    free(png);
}

/* A request with n copies of the heavy PNG (a data URL each), max_tokens 2. */
static char *heavy_request(const char *id, int n)
{
    char *url = pu_data_url(png, png_len); /* data:image/jpeg;base64,... */
    const char *b64 = strchr(url, ',') + 1;
    size_t one = strlen(b64) + 96, cap = (size_t)n * one + 1;
    char *parts = malloc(cap);
    if (!parts)
        pu_die("out of memory");
    size_t len = 0;
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(parts + len, cap - len,
                                "%s{\"type\":\"image_url\",\"image_url\":{\"url\":"
                                "\"data:image/png;base64,%s\"}}",
                                i ? "," : "", b64);
    char *body = pu_chat_request(id, "What is this?", parts, "\"max_tokens\":2");
    free(parts);
    free(url);
    return body;
}

static int64_t first_record_us(const char *id)
{
    const pu_record *recs[64];
    size_t n = pu_client_replies(&client, id, recs, 64);
    int64_t t = -1;
    for (size_t i = 0; i < n; i++)
        if (t < 0 || recs[i]->t_us < t)
            t = recs[i]->t_us;
    return t;
}

static void test_request_budget(void)
{
    char *body = heavy_request("over-budget", 3);
    int64_t t0 = pu_now_ms();
    check(pu_client_send(&client, "over-budget", body), "over-budget: produce");
    const pu_record *f = pu_client_wait(&client, "over-budget", ANSWER_MS);
    cJSON *j = f ? pu_json(f) : NULL;
    const char *code = pu_error_code(j);
    const char *message = pu_json_str(j, PU_PATH("error", "message"));
    check(code && !strcmp(code, "image_too_large") && message &&
              strstr(message, "max_request_pixels"),
          "three 7071x7071 PNGs: error %s (%s)", code ? code : "(none)",
          message ? message : "");
    fprintf(stderr, "over budget: %s in %lld ms: %s\n", code ? code : "(none)",
            (long long)(pu_now_ms() - t0), message ? message : "");
    cJSON_Delete(j);
    free(body);
}

static void test_no_stall(void)
{
    char *heavy = heavy_request("heavy", 2);
    char *text = pu_chat_request("text", "Hello", NULL, "\"max_tokens\":2");
    int64_t end0[2];
    check(pu_end_offsets(&client, PU_REQUESTS, 2, end0), "end offsets");

    int64_t t_heavy = pu_now_us();
    check(pu_client_send_to(&client, PU_REQUESTS, PARTITION, "heavy", heavy, strlen(heavy), NULL,
                            0),
          "heavy: produce");
    pu_sleep_ms(SETTLE_MS);
    int64_t t_text = pu_now_us();
    check(pu_client_send_to(&client, PU_REQUESTS, PARTITION, "text", text, strlen(text), NULL, 0),
          "text: produce");
    const pu_record *tf = pu_client_wait(&client, "text", ANSWER_MS);
    const pu_record *hf = pu_client_wait(&client, "heavy", ANSWER_MS);
    check(tf && hf, "answers: text %s, heavy %s", tf ? "yes" : "no", hf ? "yes" : "no");
    cJSON *hj = hf ? pu_json(hf) : NULL;
    check(pu_json_num(hj, PU_PATH("usage", "images")) == 2, "heavy: answered with 2 images (%s)",
          pu_error_code(hj) ? pu_error_code(hj) : "-");
    cJSON_Delete(hj);
    if (tf && hf) {
        double text_ms = (tf->t_us - t_text) / 1000.0;
        double heavy_ms = (first_record_us("heavy") - t_heavy) / 1000.0;
        fprintf(stderr, "text answered in %.0f ms; heavy request's first record after %.0f ms\n",
                text_ms, heavy_ms);
        check(text_ms * STALL_RATIO < heavy_ms,
              "the text request waited %.0f ms, the heavy one took %.0f ms to its first record",
              text_ms, heavy_ms);
        check(tf->offset >= 0 && hf->offset >= 0, "records read");
    }

    /* Finished out of offset order, both offsets are committed. */
    int64_t committed[2] = {-1, -1};
    int64_t deadline = pu_now_ms() + COMMIT_MS;
    while (pu_committed(brokers, GROUP, PU_REQUESTS, 2, committed) &&
           committed[PARTITION] < end0[PARTITION] + 2 && pu_now_ms() < deadline)
        pu_sleep_ms(PU_POLL_MS * 10);
    check(committed[PARTITION] == end0[PARTITION] + 2,
          "partition %d committed at %lld, want %lld", PARTITION,
          (long long)committed[PARTITION], (long long)(end0[PARTITION] + 2));
    free(heavy);
    free(text);
}

int main(void)
{
    if (!pu_which("redis-server"))
        ml_test_skip("needs redis-server on PATH");
    atexit(cleanup);
    if (!(png = (uint8_t *)pu_slurp(HEAVY_PNG, &png_len)))
        pu_die(HEAVY_PNG);
    pu_micro_stack_start("images", dir, model, &redis, &kafka, TOPICS, brokers, sizeof brokers);
    pu_worker_env env = {brokers, redis.url, model, dir};
    char threads[64], pixels[64];
    snprintf(threads, sizeof threads, "worker.prep_threads=%d", PREP_THREADS);
    snprintf(pixels, sizeof pixels, "limits.max_request_pixels=%d", REQUEST_PIXELS);
    const char *extra[] = {threads, pixels, NULL};
    if (!pu_worker_start(&worker, &env, "images", extra))
        pu_die("worker start");
    if (!pu_wait_assigned(&worker, PU_START_MS))
        pu_die("worker assignment");
    const char *topics[] = {PU_REPLIES, PU_DLT};
    pu_client_init(&client, brokers, topics, 2);

    int64_t t0 = pu_now_ms();
    test_request_budget();
    test_no_stall();
    fprintf(stderr, "images: %.1f s\n", (pu_now_ms() - t0) / 1000.0);

    int code = pu_stop(&worker, PU_STOP_MS);
    check(code == 0, "worker exit code %d after SIGTERM", code);
    pu_check_log_clean(worker.log);
    pu_client_deinit(&client);
    return check_done();
}
