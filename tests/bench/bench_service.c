/* Service overhead of `mllama worker`: what Kafka, JSON, Redis, the prep
 * thread and the reply path add to the model's own time, per request and
 * per token.
 *
 *     ML_BENCH=1 bench_service [REQUESTS [MAX_TOKENS]]
 *
 * Without ML_BENCH=1 it exits 77 (skipped) at once. A real worker process on
 * the micro model serves one request at a time (no queueing) from
 * `mllama mock-kafka` with a redis-server; the client timestamps each reply
 * record as it arrives. The worker reports its model time in the final
 * record (timings: ttft_ms = submit to first token, vision and prefill
 * included; decode_ms = first token to finish), so
 *
 *   per request: added = (final record seen - request produced) - (ttft_ms + decode_ms)
 *   per token:   added = (final seen - first chunk seen - decode_ms) / (tokens - 1),
 *                and, for the p99, every gap between two chunk records minus
 *                the request's mean decode step.
 *
 * The micro model takes a couple of milliseconds per token, so the fraction
 * printed is a worst case: a real model's steps are 10-100x longer while the
 * added time stays the same. Both sides fetch with fetch.wait.max.ms=1: the
 * mock answers a Fetch that finds nothing only after that wait (a broker
 * answers as data arrives), so a longer wait would measure the mock. Series:
 * text requests with the worker's default producer linger.ms (0), the same
 * with linger.ms=5, and requests with an inline JPEG (decode and
 * preprocessing run on the prep thread, so they count as added time). */
#include "bench/bench_samples.h"
#include "service/proc_util.h"

#define TOPICS PU_REQUESTS ":4," PU_REPLIES ":4," PU_DLT ":1," PU_CANCEL ":1"
#define IMAGE ML_SOURCE_DIR "/tests/golden/fixtures/images/ex_640x480.jpg"
#define DEFAULT_REQUESTS 50
#define DEFAULT_TOKENS 64
#define IMAGE_TOKENS 16
#define WARMUP 3
#define MAX_RECORDS 4096
#define ANSWER_MS 30000
#define JOIN_MS 30000
#define GOAL_FRACTION 0.05
#define GOAL_P99_MS 5.0

static pu_stack st;
static pu_proc *const worker = &st.workers[0];
static pu_client client;

typedef struct series {
    samples request_ms, model_ms, added_ms, token_added_ms, gap_added_ms, fraction;
    double tokens;
} series;

/* One request, alone in the worker; its samples go to s (unless warming up). */
static void run_one(series *s, const char *id, const char *image_part, int max_tokens,
                    bool record)
{
    char extra[64];
    snprintf(extra, sizeof extra, "\"max_tokens\":%d,\"temperature\":0", max_tokens);
    char *body = pu_chat_request(id, "Tell me about the sea.", image_part, extra);
    int64_t t0 = pu_now_us();
    if (!pu_client_send(&client, id, body))
        pu_die("produce");
    free(body);
    const pu_record *f = pu_client_wait(&client, id, ANSWER_MS);
    if (!f)
        pu_die("no answer");
    cJSON *j = pu_json(f);
    double ttft = pu_json_num(j, PU_PATH("timings", "ttft_ms"));
    double decode = pu_json_num(j, PU_PATH("timings", "decode_ms"));
    double tokens = pu_json_num(j, PU_PATH("usage", "completion_tokens"));
    const char *error = pu_error_code(j);
    if (error || isnan(ttft) || isnan(decode) || tokens < 2)
        pu_die("unexpected final record");
    cJSON_Delete(j);
    /* Arrival times in ms since the produce began; a record per token at
     * most, and the final one. */
    const pu_record *recs[MAX_RECORDS];
    size_t n = pu_client_replies(&client, id, recs, MAX_RECORDS);
    if (n > MAX_RECORDS)
        pu_die("more records than tokens");
    double first = (double)(recs[0]->t_us - t0) / 1000;
    double last = (double)(recs[n - 1]->t_us - t0) / 1000;
    if (!record)
        return;
    double model_time = ttft + decode;
    samples_add(&s->request_ms, last);
    samples_add(&s->model_ms, model_time);
    samples_add(&s->added_ms, last - model_time);
    samples_add(&s->fraction, (last - model_time) / model_time);
    samples_add(&s->token_added_ms, (last - first - decode) / (tokens - 1));
    double step = decode / (double)(n > 1 ? n - 1 : 1);
    for (size_t i = 1; i < n; i++)
        samples_add(&s->gap_added_ms, (double)(recs[i]->t_us - recs[i - 1]->t_us) / 1000 - step);
    s->tokens += tokens;
}

static void report(const char *name, series *s)
{
    double fraction = samples_mean(&s->fraction);
    double p99_token = samples_percentile(&s->gap_added_ms, 99);
    printf("%-24s requests %zu, %.1f tokens each\n", name, s->request_ms.n,
           s->tokens / (double)s->request_ms.n);
    printf("  %-22s mean %8.2f ms  p50 %8.2f  p99 %8.2f\n", "observed per request",
           samples_mean(&s->request_ms), samples_percentile(&s->request_ms, 50), samples_percentile(&s->request_ms, 99));
    printf("  %-22s mean %8.2f ms  p50 %8.2f  p99 %8.2f\n", "model per request",
           samples_mean(&s->model_ms), samples_percentile(&s->model_ms, 50), samples_percentile(&s->model_ms, 99));
    printf("  %-22s mean %8.2f ms  p50 %8.2f  p99 %8.2f\n", "added per request",
           samples_mean(&s->added_ms), samples_percentile(&s->added_ms, 50), samples_percentile(&s->added_ms, 99));
    printf("  %-22s mean %8.3f ms  p99 (per chunk gap) %8.3f ms\n", "added per token",
           samples_mean(&s->token_added_ms), p99_token);
    printf("  %-22s mean %7.1f %%  (goal <= %.0f %%; p99 per token goal <= %.0f ms: %s)\n",
           "added / model time", 100 * fraction, 100 * GOAL_FRACTION, GOAL_P99_MS,
           p99_token <= GOAL_P99_MS ? "met" : "not met");
    samples *all[] = {&s->request_ms, &s->model_ms, &s->added_ms, &s->token_added_ms,
                      &s->gap_added_ms, &s->fraction};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        samples_free(all[i]);
}

static void start_worker(const char *name, const char *const *extra)
{
    if (!pu_worker_start(worker, &st.env, name, extra) || !pu_wait_assigned(worker, JOIN_MS))
        pu_die("worker start");
}

static void run_series(const char *name, const char *image_part, int n, int max_tokens)
{
    series s = {0};
    char id[64];
    for (int i = 0; i < WARMUP + n; i++) {
        snprintf(id, sizeof id, "%s-%d", name, i);
        run_one(&s, id, image_part, max_tokens, i >= WARMUP);
    }
    report(name, &s);
}

int main(int argc, char **argv)
{
    ml_bench_require();
    int n = argc > 1 ? atoi(argv[1]) : DEFAULT_REQUESTS;
    int max_tokens = argc > 2 ? atoi(argv[2]) : DEFAULT_TOKENS;
    if (n < 1 || max_tokens < 2 || max_tokens >= MAX_RECORDS)
        pu_die("usage: bench_service [REQUESTS >= 1 [MAX_TOKENS in 2..4095]]");
    pu_stack_start(&st, "bench", TOPICS);
    pu_client_fetch_wait_ms = "1";
    const char *topics[] = {PU_REPLIES};
    pu_client_init(&client, st.brokers, topics, 1);

    const char *shipped[] = {"kafka.fetch.wait.max.ms=1", NULL};
    start_worker("bench-default", shipped);
    run_series("text, linger.ms 0 (shipped)", NULL, n, max_tokens);
    size_t len;
    uint8_t *image = (uint8_t *)pu_slurp(IMAGE, &len);
    if (!image)
        pu_die(IMAGE);
    char *part = pu_image_part(image, len);
    free(image);
    run_series("inline JPEG, linger.ms 0", part, n, IMAGE_TOKENS);
    free(part);
    pu_stop(worker, PU_STOP_MS);

    const char *linger[] = {"kafka.fetch.wait.max.ms=1", "kafka.linger.ms=5", NULL};
    start_worker("bench-linger", linger);
    run_series("text, linger.ms 5", NULL, n, max_tokens);
    pu_stop(worker, PU_STOP_MS);
    pu_client_deinit(&client);
    return 0;
}
