/* Adapters held in Redis, as separate processes: `mllama mock-kafka`, a real
 * redis-server and workers on the micro model, with PEFT adapters for it
 * published under mllama:adapter:<name>.
 *
 * - w1's model.adapters_dir cannot be created (its parent is a file, as a
 *   read-only root filesystem would refuse it): a request naming an adapter
 *   Redis holds gets adapter_unavailable saying why, counted in
 *   mllama_adapter_store_errors_total, and none of the adapter's bytes
 *   move (no fetch script runs); a second request gets the same answer
 *   from memory (no Redis command at all).
 * - An adapter over limits.max_adapter_bytes gets adapter_too_large naming
 *   the limit, before its bytes move (the fetch script checks the size).
 * - w2 (a writable directory) copies an adapter from Redis into
 *   <dir>/@<sha256> (pinned by the digest its publisher stored) and serves
 *   it; an adapter whose weights do not load is refused with a message that
 *   names no path, logged (adapter_refused), remembered, and not kept.
 *   With the base model's state of an image resident, a
 *   {"type":"image","sha256"} reference under an adapter that changes
 *   image states (cross-attention k/v) is answered from the Redis blob,
 *   then, the blob deleted, from the state resident under that adapter;
 *   under an adapter that leaves images alone the base state serves. A
 *   base-model request naming the adapter's state by the key the Redis
 *   index shows for it is refused (invalid_image): a client's digest is
 *   always content, never an adapter's key.
 * - Both drain on SIGTERM with exit code 0 and no sanitizer report.
 * Skipped (77) without redis-server. */
#include "adapter_util.h"

#include "engine.h"

#define IMAGE ML_SOURCE_DIR "/tests/golden/fixtures/images/ex_640x480.jpg"
#define TOPICS PU_REQUESTS ":2," PU_REPLIES ":2," PU_DLT ":1," PU_CANCEL ":1"
#define ANSWER_MS 30000
#define JOIN_MS 30000
#define MAX_ADAPTER_BYTES 16384 /* the workers' limits.max_adapter_bytes */
#define HUGE_WEIGHTS 32768      /* the weights of an adapter over that */
#define RANK 2
#define ALPHA 4
#define LORA_INIT 0.5f          /* large enough to change the micro model's answers */

static pu_stack st;
static pu_proc *const worker = &st.workers[0];
static pu_client client;
static uint8_t *image;
static size_t image_len;
static char image_sha[ML_SHA256_HEX_SIZE];

/* ---- adapters ----------------------------------------------------------------------- */

static char sha_images[SVC_SHA256_HEX_LEN + 1], sha_text[SVC_SHA256_HEX_LEN + 1];

/* Publish a random rank-RANK adapter of `modules` as mllama:adapter:<name>,
 * its target_modules the regular expression `targets`; its digest into sha. */
static void publish_adapter(const char *name, const char *targets, const pu_lora_module *modules,
                            int n, char sha[SVC_SHA256_HEX_LEN + 1])
{
    pu_adapter_files f = pu_adapter_make(st.dir, name, targets, modules, n, RANK, ALPHA, LORA_INIT);
    pu_adapter_publish(&st.redis, "mllama", name, &f, sha);
    fprintf(stderr, "adapter %s: %zu bytes of weights, sha256 %s\n", name, f.weights_len, sha);
    pu_adapter_files_free(&f);
}

static void publish_adapters(void)
{
    static const pu_lora_module images[] = {
        {"language_model.model.layers.1.cross_attn.k_proj", 64, 32},
        {"language_model.model.layers.1.cross_attn.v_proj", 64, 32}};
    static const pu_lora_module text[] = {
        {"language_model.model.layers.0.self_attn.q_proj", 64, 64},
        {"language_model.model.layers.2.self_attn.q_proj", 64, 64}};
    publish_adapter("tweak-images", ".*cross_attn\\\\.(k_proj|v_proj)", images, 2, sha_images);
    publish_adapter("tweak-text", ".*language_model.*layers\\\\.(0|2)\\\\.self_attn\\\\.q_proj",
                    text, 2, sha_text);
    /* Refused on its size alone: its bytes are never read. */
    pu_adapter_files huge = {.config = strdup("{}"), .config_len = 2,
                             .weights = calloc(1, HUGE_WEIGHTS), .weights_len = HUGE_WEIGHTS};
    pu_adapter_publish(&st.redis, "mllama", "huge", &huge, NULL);
    pu_adapter_files_free(&huge);
    /* A digest that matches its bytes, and weights that are no safetensors
     * file: refused when checked, before it is kept. */
    pu_adapter_files junk = {.config = strdup("{\"peft_type\": \"LORA\", \"r\": 2, "
                                              "\"target_modules\": [\"q_proj\"]}"),
                             .weights = strdup("not a safetensors file")};
    junk.config_len = strlen(junk.config);
    junk.weights_len = strlen(junk.weights);
    pu_adapter_publish(&st.redis, "mllama", "junk", &junk, NULL);
    pu_adapter_files_free(&junk);
}

/* Calls of one Redis command so far (INFO commandstats), -1 if unknown. */
static long redis_calls(const char *command)
{
    redisReply *rep = pu_redis_cmd(&st.redis, "INFO commandstats");
    long n = pu_redis_calls(rep, command);
    freeReplyObject(rep);
    return n;
}

/* ---- requests ----------------------------------------------------------------------- */

static bool start_worker(const char *name, const char *adapters_dir)
{
    char dir_set[2 * PU_PATH_MAX], limit_set[64];
    snprintf(dir_set, sizeof dir_set, "model.adapters_dir=%s", adapters_dir);
    snprintf(limit_set, sizeof limit_set, "limits.max_adapter_bytes=%d", MAX_ADAPTER_BYTES);
    const char *extra[] = {dir_set, limit_set, NULL};
    return pu_worker_start(worker, &st.env, name, extra) && pu_wait_assigned(worker, JOIN_MS);
}

static double metric(const char *name) { return pu_metric(pu_worker_http_port(worker), name); }

/* The final record of a request (parsed; NULL after a check failure). */
static cJSON *ask(const char *id, const char *body)
{
    check(pu_client_send(&client, id, body), "%s: produce", id);
    const pu_record *f = pu_client_wait(&client, id, ANSWER_MS);
    check(f != NULL, "%s: no final record within %d ms", id, ANSWER_MS);
    pu_check_stream(&client, id);
    return f ? pu_json(f) : NULL;
}

/* A text request under `adapter` must fail with `code`, its message
 * containing `needle`. */
static void expect_error(const char *id, const char *adapter, const char *code,
                         const char *needle)
{
    char extra[256];
    snprintf(extra, sizeof extra, "\"max_tokens\":4,\"adapter\":\"%s\"", adapter);
    char *body = pu_chat_request(id, "Hello", NULL, extra);
    cJSON *j = ask(id, body);
    const char *got = pu_error_code(j);
    const char *message = pu_json_str(j, PU_PATH("error", "message"));
    check(got && !strcmp(got, code), "%s: error code %s, want %s (%s)", id, got ? got : "(none)",
          code, message ? message : "");
    check(message && strstr(message, needle), "%s: message '%s' lacks '%s'", id,
          message ? message : "(none)", needle);
    fprintf(stderr, "%s: %s: %s\n", id, got ? got : "(none)", message ? message : "");
    cJSON_Delete(j);
    free(body);
}

/* An answered request: usage.images_cached, or -1 after a check failure. */
static double expect_answer(const char *id, const char *image_part, const char *adapter)
{
    char extra[256] = "\"max_tokens\":4";
    if (adapter)
        snprintf(extra, sizeof extra, "\"max_tokens\":4,\"adapter\":\"%s\"", adapter);
    char *body = pu_chat_request(id, "What is in the picture?", image_part, extra);
    cJSON *j = ask(id, body);
    const char *reason = pu_finish_reason(j);
    check(reason && strcmp(reason, "error"), "%s: finish_reason %s, error %s: %s", id,
          reason ? reason : "(none)", pu_error_code(j) ? pu_error_code(j) : "-",
          pu_json_str(j, PU_PATH("error", "message")) ? pu_json_str(j, PU_PATH("error", "message"))
                                                     : "");
    double images = pu_json_num(j, PU_PATH("usage", "images"));
    check(!image_part || images == 1, "%s: usage.images %g", id, images);
    double cached = reason && strcmp(reason, "error")
                        ? pu_json_num(j, PU_PATH("usage", "images_cached"))
                        : -1;
    cJSON_Delete(j);
    free(body);
    return cached;
}

/* The hex keys of the image index (<p>:img:<key>) into keys[i] (room for
 * cap); returns how many. */
static int index_keys(char (*keys)[ML_SHA256_HEX_SIZE], int cap)
{
    redisReply *rep = pu_redis_cmd(&st.redis, "KEYS mllama:img:*");
    int n = 0;
    for (size_t i = 0; rep && rep->type == REDIS_REPLY_ARRAY && i < rep->elements && n < cap; i++)
        if (strlen(rep->element[i]->str) == strlen("mllama:img:") + ML_SHA256_HEX_SIZE - 1)
            snprintf(keys[n++], ML_SHA256_HEX_SIZE, "%s",
                     rep->element[i]->str + strlen("mllama:img:"));
    freeReplyObject(rep);
    return n;
}

/* Wait until the index holds n keys (the index thread publishes them). */
static int wait_index_keys(char (*keys)[ML_SHA256_HEX_SIZE], int cap, int n)
{
    int64_t deadline = pu_now_ms() + ANSWER_MS;
    int got;
    while ((got = index_keys(keys, cap)) < n && pu_now_ms() < deadline)
        pu_sleep_ms(50);
    return got;
}

/* ---- the cases ---------------------------------------------------------------------- */

static void test_unwritable_dir(void)
{
    char file[PU_PATH_MAX + 16], adapters[PU_PATH_MAX + 32];
    snprintf(file, sizeof file, "%s/a-file", st.dir);
    check(pu_write_file(file, "x", 1), "write %s", file);
    snprintf(adapters, sizeof adapters, "%s/adapters", file);
    check(start_worker("w1", adapters), "w1 start");

    long eval0 = redis_calls("eval_ro");
    expect_error("unwritable-1", "tweak-text", "adapter_unavailable", "cannot be stored");
    check(metric("mllama_adapter_store_errors_total") == 1, "store errors: %g",
          metric("mllama_adapter_store_errors_total"));
    check(redis_calls("eval_ro") == eval0, "the adapter was fetched for an unwritable dir");
    check(pu_file_count(worker->log, "\"adapter_store_failed\"") == 1,
          "the failure is not logged once as adapter_store_failed");

    long hget0 = redis_calls("hget");
    expect_error("unwritable-2", "tweak-text", "adapter_unavailable", "remembered");
    check(redis_calls("hget") == hget0 && redis_calls("eval_ro") == eval0,
          "the second request went to Redis (hget %ld -> %ld)", hget0, redis_calls("hget"));
    check(metric("mllama_adapter_store_errors_total") == 1, "store errors: %g",
          metric("mllama_adapter_store_errors_total"));

    pu_worker_drain(worker);
}

static void test_image_under_adapter(void)
{
    char adapters[PU_PATH_MAX + 16];
    snprintf(adapters, sizeof adapters, "%s/adapters", st.dir);
    check(start_worker("w2", adapters), "w2 start");

    long hmget0 = redis_calls("hmget");
    expect_error("too-large", "huge", "adapter_too_large", "limits.max_adapter_bytes");
    check(redis_calls("hmget") == hmget0, "an adapter over the limit was transferred");
    check(metric("mllama_adapter_fetches_total") == 0, "fetches: %g",
          metric("mllama_adapter_fetches_total"));

    /* The base model's state of the image becomes resident. */
    char *inline_part = pu_image_part(image, image_len);
    check(expect_answer("base-inline", inline_part, NULL) == 0, "base-inline: cached");
    free(inline_part);

    /* The blob under its key in the default tenant's partition. */
    char blob_key[128], ref[160], partitioned[ML_SHA256_HEX_SIZE];
    pu_image_key("default", image_sha, partitioned);
    snprintf(blob_key, sizeof blob_key, "mllama:blob:img:%s", partitioned);
    snprintf(ref, sizeof ref, "{\"type\":\"image\",\"sha256\":\"%s\"}", image_sha);
    redisReply *rep = pu_redis_cmd(&st.redis, "SET %s %b", blob_key, image, image_len);
    check(rep && rep->type == REDIS_REPLY_STATUS, "SET blob");
    freeReplyObject(rep);

    /* The adapter changes the image's state: the base state cannot serve,
     * the blob does. */
    check(expect_answer("ref-images-1", ref, "tweak-images") == 0,
          "ref-images-1: served from a state the adapter does not use");
    check(metric("mllama_adapter_fetches_total") == 1, "fetches: %g",
          metric("mllama_adapter_fetches_total"));
    char copied[PU_PATH_MAX + 128];
    snprintf(copied, sizeof copied, "%s/@%s/adapter_config.json", adapters, sha_images);
    check(access(copied, R_OK) == 0, "%s missing", copied);

    /* Now the state under the adapter is resident: no blob needed. */
    rep = pu_redis_cmd(&st.redis, "DEL %s", blob_key);
    freeReplyObject(rep);
    check(expect_answer("ref-images-2", ref, "tweak-images") == 1,
          "ref-images-2: not served from the adapter's resident state");

    /* The index shows the base state's key and the adapter's: a base
     * request naming the adapter's is not served from it. */
    char keys[2][ML_SHA256_HEX_SIZE], forged[160];
    check(wait_index_keys(keys, 2, 2) == 2, "index: two image states");
    for (int k = 0; k < 2; k++) {
        snprintf(forged, sizeof forged, "{\"type\":\"image\",\"sha256\":\"%s\"}", keys[k]);
        char id[32];
        snprintf(id, sizeof id, "forged-base-%d", k);
        char *body = pu_chat_request(id, "What is in the picture?", forged, "\"max_tokens\":4");
        cJSON *j = ask(id, body);
        const char *code = pu_error_code(j);
        check(code && !strcmp(code, "invalid_image"),
              "%s: a base request naming an index key (%s) got %s, want invalid_image", id,
              keys[k], code ? code : "an answer");
        cJSON_Delete(j);
        free(body);
    }

    /* An adapter that leaves images alone shares the base state. */
    check(expect_answer("ref-text", ref, "tweak-text") == 1, "ref-text: not cached");
    check(metric("mllama_adapter_fetches_total") == 2, "fetches: %g",
          metric("mllama_adapter_fetches_total"));
    check(metric("mllama_adapter_store_errors_total") == 0, "store errors: %g",
          metric("mllama_adapter_store_errors_total"));

    /* Bytes that do not load are refused before they are kept: the client
     * gets a generic message (no path), the log the reason; remembered. */
    long eval0 = redis_calls("eval_ro");
    expect_error("junk-1", "junk", "adapter_unavailable", "cannot be served by this worker");
    check(pu_file_count(worker->log, "\"adapter_refused\"") == 1, "junk: not logged");
    expect_error("junk-2", "junk", "adapter_unavailable", "remembered");
    check(redis_calls("eval_ro") == eval0 + 1, "junk fetched %ld times", redis_calls("eval_ro") - eval0);
    char kept[2 * PU_PATH_MAX];
    snprintf(kept, sizeof kept, "%s/junk", adapters);
    check(access(kept, F_OK) != 0, "junk was kept");
    pu_worker_drain(worker);
}

int main(void)
{
    pu_stack_start(&st, "adapters", TOPICS);
    image = pu_slurp_image(IMAGE, &image_len, image_sha);
    const char *topics[] = {PU_REPLIES};
    pu_client_init(&client, st.brokers, topics, 1);
    publish_adapters();

    test_unwritable_dir();
    test_image_under_adapter();

    pu_client_deinit(&client);
    free(image);
    return check_done();
}
