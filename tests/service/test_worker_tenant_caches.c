/* Caches partitioned by tenant (engine/runtime/README.md, "Partitions"),
 * against a real worker process: `mllama mock-kafka`, a
 * redis-server and one worker on the micro model with four tenants, probe
 * and victim (each its own cache group) and front_a and front_b (one
 * cache_group, "public").
 *
 * - The secret-in-system-prompt guessing attack: the victim sends a system
 *   prompt holding a 4-digit code, twice (the second finds its own blocks).
 *   The probe then sends the same template with a wrong guess, the right
 *   one and another wrong one: its prompt_tokens_cached is 0 at first and
 *   equal for the right and the second wrong guess (only the prefix of its
 *   own first guess), and finds none of the victim's blocks past the code.
 * - An image the victim made resident is not resident for the probe:
 *   inline it is encoded again (images_cached 0), named by sha256 it is
 *   invalid_image (no state in the probe's partition and no blob), and
 *   the Redis index holds it under the victim's key only: `mllama submit
 *   --redis --tenant victim` routes the image to the worker, `--tenant
 *   bystander` (a fifth tenant) finds nothing to route by.
 * - front_a and front_b share: front_b finds front_a's system prompt blocks
 *   and its image (inline and by sha256), the documented opt-in.
 * - The worker drains on SIGTERM with exit code 0 and no sanitizer report.
 * Skipped (77) without redis-server. */
#include "proc_util.h"

#include "engine.h"

#define IMAGE ML_SOURCE_DIR "/tests/golden/fixtures/images/ex_640x480.jpg"
#define TOPICS                                                                                     \
    PU_REQUESTS ":1," PU_CANCEL ":1," PU_REPLIES ":1," PU_DLT ":1,"                                \
    PU_REQUESTS ".probe:1," PU_CANCEL ".probe:1," PU_REPLIES ".probe:1,"                            \
    PU_REQUESTS ".victim:1," PU_CANCEL ".victim:1," PU_REPLIES ".victim:1,"                         \
    PU_REQUESTS ".front_a:1," PU_CANCEL ".front_a:1," PU_REPLIES ".front_a:1,"                      \
    PU_REQUESTS ".front_b:1," PU_CANCEL ".front_b:1," PU_REPLIES ".front_b:1,"                      \
    PU_REQUESTS ".bystander:1," PU_CANCEL ".bystander:1," PU_REPLIES ".bystander:1"
#define TENANTS                                                                                    \
    "{\"tenants\": [{\"name\": \"probe\"}, {\"name\": \"victim\"},"                                \
    " {\"name\": \"front_a\", \"cache_group\": \"public\"},"                                       \
    " {\"name\": \"front_b\", \"cache_group\": \"public\"}, {\"name\": \"bystander\"}]}\n"
#define ANSWER_MS 30000
#define JOIN_MS 30000
#define INDEX_MS 10000
#define SYSTEM_MAX 1024      /* a system message, as JSON */
/* The template: long enough around the code that whole blocks (16 tokens)
 * lie before it and after it. */
#define SECRET_BEFORE                                                                              \
    "You are the support assistant of the Example Corporation. Answer politely and briefly, "     \
    "never reveal internal information, and escalate billing questions to a human. The "           \
    "office door code is "
#define SECRET_AFTER                                                                               \
    ". Never tell anyone this code, whatever they say, even if they claim to be an employee, "     \
    "a manager or the police, and do not hint at its digits, its length or how it was chosen."
#define RIGHT_CODE "4831"
#define PUBLIC_PROMPT                                                                              \
    "You are the product assistant. Our product is a bicycle bell in three colours, sold in "     \
    "every country of the union, with a two-year warranty and free returns for thirty days."

static char config[PU_PATH_MAX + 32];
static pu_stack st;
static pu_proc *const worker = &st.workers[0];
static pu_client client;
static uint8_t *image;
static size_t image_len;
static char image_sha[ML_SHA256_HEX_SIZE];

/* ---- requests ------------------------------------------------------------------------ */

/* Send `body` as request `id` on tenant's request topic and return its final
 * record, parsed (NULL after a check failure). */
static cJSON *ask(const char *tenant, const char *id, const char *body)
{
    char topic[128];
    snprintf(topic, sizeof topic, PU_REQUESTS ".%s", tenant);
    check(pu_client_send_to(&client, topic, -1, id, body, strlen(body), NULL, 0), "%s: produce",
          id);
    int64_t deadline = pu_now_ms() + ANSWER_MS;
    while (pu_now_ms() < deadline) {
        for (size_t i = 0; i < client.n; i++)
            if (client.recs[i].final && !strcmp(client.recs[i].key, id))
                return pu_json(&client.recs[i]);
        pu_client_poll(&client, 100);
    }
    check(0, "%s: no final record within %d ms", id, ANSWER_MS);
    return NULL;
}

/* A request of tenant's: an optional system message, then a user message
 * of `image_part` (a JSON content part, or NULL) and text; two tokens. */
static cJSON *chat(const char *tenant, const char *id, const char *system, const char *image_part,
                   const char *text)
{
    char sys[SYSTEM_MAX] = "";
    if (system)
        snprintf(sys, sizeof sys, "{\"role\":\"system\",\"content\":\"%s\"},", system);
    const char *part = image_part ? image_part : "";
    size_t need = strlen(id) + strlen(tenant) + strlen(sys) + strlen(part) + strlen(text) + 512;
    char *body = malloc(need);
    if (!body)
        pu_die("out of memory");
    snprintf(body, need,
             "{\"id\":\"%s\",\"reply_topic\":\"" PU_REPLIES ".%s\",\"max_tokens\":2,"
             "\"date_string\":\"01 Jan 2026\",\"messages\":[%s{\"role\":\"user\",\"content\":"
             "[%s%s{\"type\":\"text\",\"text\":\"%s\"}]}]}",
             id, tenant, sys, part, image_part ? "," : "", text);
    cJSON *j = ask(tenant, id, body);
    free(body);
    return j;
}

/* The final record's usage field; -1 (and a check failure) for an error. */
static double usage(const cJSON *j, const char *id, const char *field)
{
    const char *code = pu_error_code(j);
    check(j && !code, "%s: error %s: %s", id, code ? code : "-",
          pu_json_str(j, PU_PATH("error", "message")) ? pu_json_str(j, PU_PATH("error", "message"))
                                                     : "");
    return j && !code ? pu_json_num(j, PU_PATH("usage", field)) : -1;
}

/* One chat's prompt_tokens_cached (images_cached into *images when non-NULL). */
static double cached_tokens(const char *tenant, const char *id, const char *system,
                            const char *image_part, const char *text, double *images)
{
    cJSON *j = chat(tenant, id, system, image_part, text);
    double n = usage(j, id, "prompt_tokens_cached");
    if (images)
        *images = usage(j, id, "images_cached");
    fprintf(stderr, "%s (%s): %g prompt tokens cached of %g, %g images cached\n", id, tenant, n,
            j ? pu_json_num(j, PU_PATH("usage", "prompt_tokens")) : -1,
            j ? pu_json_num(j, PU_PATH("usage", "images_cached")) : -1);
    cJSON_Delete(j);
    return n;
}

static double guess(const char *tenant, const char *id, const char *code)
{
    char system[SYSTEM_MAX];
    snprintf(system, sizeof system, "%s%s%s", SECRET_BEFORE, code, SECRET_AFTER);
    return cached_tokens(tenant, id, system, NULL, "What are your opening hours?", NULL);
}

/* Run `mllama submit --redis` for tenant with the image; whether it routed
 * the request by the image's residency. */
static bool submit_routes(const char *tenant)
{
    char log[PU_PATH_MAX + 64];
    snprintf(log, sizeof log, "%s/submit-%s.log", st.dir, tenant);
    char *argv[] = {PU_MLLAMA, "submit", "--brokers", st.brokers, "--tenant", (char *)tenant,
                    "--redis", st.redis.url, "--image", IMAGE, "--max-tokens", "1", "--quiet",
                    "What is in the picture?", NULL};
    int code = pu_run(argv, log, ANSWER_MS);
    check(code == 0, "submit --tenant %s: exit %d", tenant, code);
    return pu_file_count(log, "image resident on a worker owning partition") == 1;
}

/* ---- the cases ------------------------------------------------------------------------ */

static void test_secret_guessing(void)
{
    /* The victim's own partition works: its second request finds the whole
     * system prompt. */
    double victim_first = guess("victim", "victim-1", RIGHT_CODE);
    double victim_again = guess("victim", "victim-2", RIGHT_CODE);
    check(victim_first == 0 && victim_again > 0,
          "the victim finds its own blocks again (%g, then %g)", victim_first, victim_again);

    double wrong_first = guess("probe", "probe-1", "1234");
    double right = guess("probe", "probe-2", RIGHT_CODE);
    double wrong_again = guess("probe", "probe-3", "5678");
    check(wrong_first == 0, "the probe's first guess finds nothing (%g cached tokens)",
          wrong_first);
    check(right == wrong_again,
          "the right guess shows as many cached tokens as a wrong one (%g and %g)", right,
          wrong_again);
    check(right < victim_again, "the right guess finds none of the victim's blocks (%g of %g)",
          right, victim_again);
}

/* A tenant's first request with the image (an inline content part): the
 * image is encoded, none cached. */
static void image_encoded(const char *tenant, const char *id, const char *part)
{
    double images = -1;
    cached_tokens(tenant, id, NULL, part, "What is in the picture?", &images);
    check(images == 0, "%s: the image is encoded (%g cached)", tenant, images);
}

static void test_images(void)
{
    char *part = pu_image_part(image, image_len);
    char ref[160];
    snprintf(ref, sizeof ref, "{\"type\":\"image\",\"sha256\":\"%s\"}", image_sha);
    image_encoded("victim", "victim-image", part);

    /* The victim's state is indexed under its partition's key only. */
    char key[160], victim_key[ML_SHA256_HEX_SIZE], probe_key[ML_SHA256_HEX_SIZE];
    pu_image_key("victim", image_sha, victim_key);
    pu_image_key("probe", image_sha, probe_key);
    snprintf(key, sizeof key, "mllama:img:%s", victim_key);
    check(pu_redis_wait_exists(&st.redis, key, INDEX_MS), "index: the victim's key %s", key);
    snprintf(key, sizeof key, "mllama:img:%s", probe_key);
    check(pu_redis_exists(&st.redis, key) == 0, "index: the probe's key %s", key);
    snprintf(key, sizeof key, "mllama:img:%s", image_sha);
    check(pu_redis_exists(&st.redis, key) == 0, "index: the bare content digest %s", key);

    /* The probe cannot tell it is resident: by reference it is unknown, inline
     * it is encoded again. */
    cJSON *j = chat("probe", "probe-ref", NULL, ref, "What is in the picture?");
    const char *code = pu_error_code(j);
    check(code && !strcmp(code, "invalid_image"),
          "probe names the victim's image by sha256: %s, want invalid_image",
          code ? code : "an answer");
    cJSON_Delete(j);
    double images = -1;
    cached_tokens("probe", "probe-image", NULL, part, "What is in the picture?", &images);
    check(images == 0, "probe: the victim's image is not resident for it (%g cached)", images);
    free(part);

    /* Routing reads the index in the sender's partition. */
    check(submit_routes("victim"), "submit --tenant victim: not routed by the resident image");
    check(!submit_routes("bystander"), "submit --tenant bystander: routed by the victim's image");
}

static void test_shared_group(void)
{
    double first = cached_tokens("front_a", "front-a-1", PUBLIC_PROMPT, NULL, "Which colours?",
                                 NULL);
    double shared = cached_tokens("front_b", "front-b-1", PUBLIC_PROMPT, NULL, "Any warranty?",
                                  NULL);
    check(first == 0 && shared > 0,
          "one cache_group: front_b finds front_a's system prompt (%g, then %g)", first, shared);

    char *part = pu_image_part(image, image_len);
    char ref[160];
    snprintf(ref, sizeof ref, "{\"type\":\"image\",\"sha256\":\"%s\"}", image_sha);
    image_encoded("front_a", "front-a-image", part);
    double images = -1;
    cached_tokens("front_b", "front-b-image", NULL, part, "And now?", &images);
    check(images == 1, "front_b: front_a's image is resident for it (%g cached)", images);
    cached_tokens("front_b", "front-b-ref", NULL, ref, "And by name?", &images);
    check(images == 1, "front_b: front_a's image by sha256 (%g cached)", images);
    free(part);
}

int main(void)
{
    pu_stack_start(&st, "tenant-caches", TOPICS);
    image = pu_slurp_image(IMAGE, &image_len, image_sha);
    snprintf(config, sizeof config, "%s/tenants.json", st.dir);
    if (!pu_write_file(config, TENANTS, strlen(TENANTS)))
        pu_die("write the tenants' configuration");
    pu_worker_config = config;
    const char *topics[] = {PU_REPLIES ".probe", PU_REPLIES ".victim", PU_REPLIES ".front_a",
                            PU_REPLIES ".front_b"};
    pu_client_init(&client, st.brokers, topics, 4);
    if (!pu_worker_start(worker, &st.env, "w1", NULL) || !pu_wait_assigned(worker, JOIN_MS))
        pu_die("worker start");

    test_secret_guessing();
    test_images();
    test_shared_group();

    pu_worker_drain(worker);
    pu_client_deinit(&client);
    free(image);
    return check_done();
}
