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
 * - An inline image whose state is evicted between its prep (which skipped
 *   the decode: the state was resident) and its admission is decoded again
 *   on the prep pool and the request answered as a cache miss, one stream
 *   (the runtime ends it with ML_REQERR_IMAGE_EVICTED; the step thread never
 *   decodes). On the tiny model, whose image state (6.6 MB) is the only one
 *   runtime.image_mib 8 holds, with two running requests: X answered (X
 *   resident); two long text requests running; Y submitted and waiting; X
 *   again, prepared while X is resident, waiting behind Y; the text
 *   requests cancelled, so Y's admission evicts X before X's. (Two running
 *   slots, because the worker stops consuming at twice max_running
 *   requests in flight.)
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
#define SMALL_JPEG ML_SOURCE_DIR "/tests/golden/fixtures/images/tiny_16x16.jpg"
#define EVICT_IMAGE_MIB 8        /* one tiny-model image state (6.6 MB) */
#define LONG_TOKENS 32768        /* the blocking text request: cancelled long before */
#define LONG_LIMIT "limits.max_tokens=32768"
#define QUEUE_MS 60000           /* requests reaching the runtime's queue */
#define CANCEL_TRIES 5
#define EVICT_RUNNING 2          /* runtime.max_running: the blockers */

static char dir[PU_PATH_MAX], model[PU_PATH_MAX + 16], brokers[256];
static pu_redis redis;
static pu_proc kafka, worker, tiny_worker;
static pu_client client;
static uint8_t *png;
static size_t png_len;

static void cleanup(void)
{
    pu_kill(&worker);
    pu_kill(&tiny_worker);
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

/* Wait until metric `name` of the worker on `port` reaches `want`. */
static bool wait_metric(int port, const char *name, double want, int timeout_ms)
{
    for (int64_t deadline = pu_now_ms() + timeout_ms; pu_now_ms() < deadline;
         pu_sleep_ms(PU_POLL_MS))
        if (pu_metric(port, name) >= want)
            return true;
    return false;
}

/* Send a request with one inline JPEG (bytes), max_tokens 2. */
static void send_image(const char *id, const uint8_t *bytes, size_t n)
{
    char *part = pu_image_part(bytes, n);
    char *body = pu_chat_request(id, "What is this?", part, "\"max_tokens\":2");
    check(pu_client_send(&client, id, body), "%s: produce", id);
    free(body);
    free(part);
}

/* The request was answered (not an error) with its one image, images_cached
 * of it from the cache, in one attempt. */
static void expect_answered(const char *id, int images_cached)
{
    const pu_record *f = pu_client_wait(&client, id, ANSWER_MS);
    cJSON *j = f ? pu_json(f) : NULL;
    const char *reason = pu_finish_reason(j);
    check(reason && strcmp(reason, "error") &&
              pu_json_num(j, PU_PATH("usage", "images")) == 1 &&
              pu_json_num(j, PU_PATH("usage", "images_cached")) == images_cached,
          "%s: finish %s (error %s), want an answer with %d of 1 image cached", id,
          reason ? reason : "(none)", pu_error_code(j) ? pu_error_code(j) : "-", images_cached);
    check(pu_check_stream(&client, id) == 1, "%s: one attempt, seqs in order", id);
    cJSON_Delete(j);
}

static void test_evicted_before_admission(const pu_worker_env *env)
{
    char tiny_dir[PU_PATH_MAX + 16], model_dir[PU_PATH_MAX + 32], image_mib[64];
    snprintf(tiny_dir, sizeof tiny_dir, "%s/tiny", dir);
    snprintf(model_dir, sizeof model_dir, "model.dir=%s", tiny_dir);
    snprintf(image_mib, sizeof image_mib, "runtime.image_mib=%d", EVICT_IMAGE_MIB);
    char threads[64], running[64];
    snprintf(threads, sizeof threads, "worker.prep_threads=%d", PREP_THREADS);
    snprintf(running, sizeof running, "runtime.max_running=%d", EVICT_RUNNING);
    const char *extra[] = {model_dir, "model.preset_if_missing=tiny", image_mib, running,
                           threads, LONG_LIMIT, NULL};
    if (!pu_worker_start(&tiny_worker, env, "images-tiny", extra) ||
        !pu_wait_assigned(&tiny_worker, PU_START_MS))
        pu_die("tiny worker start");
    int port = pu_worker_http_port(&tiny_worker);

    size_t x_len;
    uint8_t *x = (uint8_t *)pu_slurp(SMALL_JPEG, &x_len);
    if (!x)
        pu_die(SMALL_JPEG);
    /* Y: the same pixels, other bytes (after EOI, which decoders ignore). */
    uint8_t *y = malloc(x_len + 1);
    if (!y)
        pu_die("out of memory");
    memcpy(y, x, x_len);
    y[x_len] = 0;

    send_image("evict-x", x, x_len);
    expect_answered("evict-x", 0);

    char extra_long[192];
    snprintf(extra_long, sizeof extra_long, "\"max_tokens\":%d,\"temperature\":0," PU_NO_STOP,
             LONG_TOKENS);
    static const char *const blockers[EVICT_RUNNING] = {"evict-blocker-0", "evict-blocker-1"};
    for (int i = 0; i < EVICT_RUNNING; i++) {
        char *blocker = pu_chat_request(blockers[i], "Tell me a story.", NULL, extra_long);
        check(pu_client_send(&client, blockers[i], blocker), "%s: produce", blockers[i]);
        free(blocker);
    }
    check(wait_metric(port, "mllama_requests_running", EVICT_RUNNING, QUEUE_MS),
          "blockers running");
    send_image("evict-y", y, x_len + 1);
    check(wait_metric(port, "mllama_requests_waiting", 1, QUEUE_MS), "y waiting");
    send_image("evict-x-again", x, x_len);
    check(wait_metric(port, "mllama_requests_waiting", 2, QUEUE_MS), "x again waiting");
    check(pu_metric(port, "mllama_image_decodes_skipped_total") == 1,
          "x again: its decode skipped (resident at prep)");

    /* The cancel consumer may join late: repeat until each blocker ends. */
    for (int b = 0; b < EVICT_RUNNING; b++) {
        const pu_record *f = NULL;
        for (int i = 0; i < CANCEL_TRIES && !f; i++) {
            check(pu_client_send_to(&client, PU_CANCEL, -1, blockers[b], "cancel", 6, NULL, 0),
                  "cancel: produce");
            f = pu_client_wait(&client, blockers[b], ANSWER_MS / CANCEL_TRIES);
        }
        cJSON *bj = f ? pu_json(f) : NULL;
        const char *reason = pu_finish_reason(bj);
        check(reason && !strcmp(reason, "cancelled"), "%s: finish %s", blockers[b],
              reason ? reason : "(none)");
        cJSON_Delete(bj);
    }

    expect_answered("evict-y", 0);
    expect_answered("evict-x-again", 0); /* X was evicted by Y: decoded again */
    check(pu_metric(port, "mllama_image_late_decodes_total") == 1,
          "one late decode, on the prep pool (%g)",
          pu_metric(port, "mllama_image_late_decodes_total"));
    free(x);
    free(y);

    int code = pu_stop(&tiny_worker, PU_STOP_MS);
    check(code == 0, "tiny worker exit code %d after SIGTERM", code);
    pu_check_log_clean(tiny_worker.log);
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
    int code = pu_stop(&worker, PU_STOP_MS);
    check(code == 0, "worker exit code %d after SIGTERM", code);
    pu_check_log_clean(worker.log);
    test_evicted_before_admission(&env);
    fprintf(stderr, "images: %.1f s\n", (pu_now_ms() - t0) / 1000.0);
    pu_client_deinit(&client);
    return check_done();
}
