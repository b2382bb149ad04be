/* response_format json_schema through a running `mllama worker` (mock Kafka
 * and redis-server as processes, the micro model):
 * - requests with an invoice schema (an image with one of them, streamed
 *   and not, several seeds at temperature 1) answer documents that are
 *   valid as the independent validator (tests/engine/schema_oracle.h)
 *   judges them, with their members in the order `properties` defines them
 *   (the schema has a pattern, a date format, integer ranges, an enum,
 *   string and array bounds, closed objects); a stream's chunks concatenate
 *   to the document;
 * - the schema is compiled once: the same schema again, in another spelling
 *   (member order, whitespace), is a cache hit (mllama_schema_compiles_total,
 *   mllama_schema_cache_hits_total);
 * - max_tokens cutting the document short ends with finish_reason length;
 * - refused schemas (uniqueItems, a conditional, a malformed type, a
 *   schema over limits.max_schema_bytes) answer invalid_request naming the
 *   keyword (and its JSON Pointer) or the bound, and a good request after
 *   each is still answered: the worker keeps serving.
 * Skipped (77) without redis-server. */
#include "proc_util.h"
#include "schema_oracle.h"

#define TOPICS PU_REQUESTS ":1," PU_REPLIES ":1," PU_DLT ":1," PU_CANCEL ":1"
#define IMAGE ML_SOURCE_DIR "/tests/golden/fixtures/images/ex_640x480.jpg"
#define ANSWER_MS 60000
#define MAX_SCHEMA_BYTES 4096 /* the worker's limits.max_schema_bytes */
/* Enough for the longest document the schema allows: its bytes are bounded
 * (every string, number and array is), whitespace between tokens comes in
 * runs of at most 64 bytes, and a token is at least one byte. */
#define MAX_TOKENS 3000
#define SEEDS 4
#define CUT_TOKENS 4          /* max_tokens of the request cut short */

/* An invoice, in definition order (the order the document must follow). */
#define INVOICE_SCHEMA                                                                         \
    "{\"type\":\"object\",\"properties\":{"                                                    \
    "\"vendor\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":8},"                        \
    "\"ref\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{3}-[0-9]{2}$\"},"                       \
    "\"date\":{\"type\":\"string\",\"format\":\"date\"},"                                      \
    "\"total\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":100000},"                       \
    "\"items\":{\"type\":\"array\",\"minItems\":1,\"maxItems\":3,\"items\":{"                  \
    "\"type\":\"object\",\"properties\":{"                                                     \
    "\"name\":{\"type\":\"string\",\"maxLength\":6},"                                          \
    "\"qty\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":9}},"                             \
    "\"required\":[\"name\",\"qty\"],\"additionalProperties\":false}},"                        \
    "\"paid\":{\"type\":\"boolean\"},"                                                         \
    "\"currency\":{\"enum\":[\"EUR\",\"USD\"]}},"                                              \
    "\"required\":[\"vendor\",\"ref\",\"date\",\"total\",\"items\",\"paid\",\"currency\"],"    \
    "\"additionalProperties\":false}"

/* The same schema spelled otherwise: members reordered, spaces. */
#define INVOICE_RESPELLED                                                                      \
    "{ \"additionalProperties\": false, \"required\": [\"vendor\", \"ref\", \"date\", "        \
    "\"total\", \"items\", \"paid\", \"currency\"], \"type\": \"object\", \"properties\": {"   \
    "\"vendor\": {\"maxLength\": 8, \"minLength\": 1, \"type\": \"string\"},"                  \
    "\"ref\": {\"pattern\": \"^[A-Z]{3}-[0-9]{2}$\", \"type\": \"string\"},"                   \
    "\"date\": {\"format\": \"date\", \"type\": \"string\"},"                                  \
    "\"total\": {\"maximum\": 100000, \"minimum\": 0, \"type\": \"integer\"},"                 \
    "\"items\": {\"items\": {\"additionalProperties\": false, \"required\": [\"name\", "       \
    "\"qty\"], \"properties\": {\"name\": {\"maxLength\": 6, \"type\": \"string\"},"           \
    "\"qty\": {\"maximum\": 9, \"minimum\": 1, \"type\": \"integer\"}}, \"type\": \"object\"}," \
    "\"maxItems\": 3, \"minItems\": 1, \"type\": \"array\"},"                                  \
    "\"paid\": {\"type\": \"boolean\"},"                                                       \
    "\"currency\": {\"enum\": [\"EUR\", \"USD\"]}} }"

static pu_stack st;
static pu_proc *const worker = &st.workers[0];
static pu_client client;
static int port, n_good;
static uint8_t *image;
static size_t image_len;

/* ---- validity: the oracle, and property order ------------------------------------ */

/* An object whose members are these, in this order. */
static bool members_are(const cJSON *o, const char *const *names, size_t n)
{
    if (!cJSON_IsObject(o))
        return false;
    const cJSON *m = o->child;
    for (size_t i = 0; i < n; i++, m = m->next)
        if (!m || strcmp(m->string, names[i]))
            return false;
    return m == NULL;
}

/* Whether text is a document valid under INVOICE_SCHEMA, as the
 * independent validator (tests/engine/schema_oracle.h) judges it, with its
 * members in the order `properties` defines them (every one is required, so
 * each object has exactly these). why (n bytes) says what failed. */
static bool invoice_valid(const char *text, char *why, size_t n)
{
    static const char *const top[] = {"vendor", "ref", "date", "total", "items", "paid",
                                      "currency"};
    static const char *const item[] = {"name", "qty"};
    cJSON *schema = cJSON_Parse(INVOICE_SCHEMA), *doc = cJSON_Parse(text);
    bool ok = schema_oracle_valid(schema, doc, why, n);
    if (ok && !members_are(doc, top, sizeof top / sizeof top[0])) {
        snprintf(why, n, "members not in the order of properties");
        ok = false;
    }
    const cJSON *items = ok ? cJSON_GetObjectItemCaseSensitive(doc, "items") : NULL, *it;
    cJSON_ArrayForEach(it, items)
    {
        if (ok && !members_are(it, item, sizeof item / sizeof item[0])) {
            snprintf(why, n, "items[]: members not in the order of properties");
            ok = false;
        }
    }
    cJSON_Delete(schema);
    cJSON_Delete(doc);
    return ok;
}

/* The check itself: a valid invoice passes, one out of order or out of
 * range does not. */
static void test_validator(void)
{
    static const char good[] = "{\"vendor\":\"ACME\",\"ref\":\"ABC-12\",\"date\":\"2024-02-29\","
                               "\"total\":12,\"items\":[{\"name\":\"bolt\",\"qty\":3}],"
                               "\"paid\":true,\"currency\":\"EUR\"}";
    static const char *const bad[] = {
        "{\"ref\":\"ABC-12\",\"vendor\":\"ACME\",\"date\":\"2024-02-29\",\"total\":12,"
        "\"items\":[{\"name\":\"bolt\",\"qty\":3}],\"paid\":true,\"currency\":\"EUR\"}",
        "{\"vendor\":\"ACME\",\"ref\":\"ABC-12\",\"date\":\"2023-02-29\",\"total\":12,"
        "\"items\":[{\"name\":\"bolt\",\"qty\":3}],\"paid\":true,\"currency\":\"EUR\"}",
        "{\"vendor\":\"ACME\",\"ref\":\"ABC-12\",\"date\":\"2024-02-29\",\"total\":12,"
        "\"items\":[{\"qty\":3,\"name\":\"bolt\"}],\"paid\":true,\"currency\":\"EUR\"}",
        "{\"vendor\":\"ACME\",\"ref\":\"ABC-12\",\"date\":\"2024-02-29\",\"total\":12,"
        "\"items\":[{\"name\":\"bolt\",\"qty\":10}],\"paid\":true,\"currency\":\"EUR\"}",
    };
    char why[256] = "";
    check(invoice_valid(good, why, sizeof why), "a valid invoice: %s", why);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        check(!invoice_valid(bad[i], why, sizeof why), "invalid invoice %zu passed", i);
}

/* ---- requests ------------------------------------------------------------------- */

/* A request with response_format json_schema around `schema`, and `extra`
 * top-level members. Owned by the caller. */
static char *schema_request(const char *id, const char *schema, const char *extra,
                            const char *image_part)
{
    size_t cap = strlen(schema) + strlen(extra) + 256;
    char *fields = malloc(cap);
    if (!fields)
        pu_die("out of memory");
    snprintf(fields, cap,
             "%s%s\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":"
             "\"invoice\",\"strict\":true,\"schema\":%s}}",
             extra, extra[0] ? "," : "", schema);
    char *body = pu_chat_request(id, "Extract the invoice as JSON.", image_part, fields);
    free(fields);
    return body;
}

/* The answer's text: the completion's content, or a stream's deltas in
 * order. Owned by the caller. */
static char *answer_text(const char *id)
{
    const pu_record *recs[MAX_TOKENS + 2];
    size_t n = pu_client_replies(&client, id, recs, MAX_TOKENS + 2);
    size_t cap = 1, len = 0;
    char *text = calloc(1, 1);
    if (!text)
        pu_die("out of memory");
    for (size_t i = 0; i < n; i++) {
        cJSON *j = pu_json(recs[i]);
        const char *part = pu_json_str(j, PU_PATH("choices", "0", "delta", "content"));
        if (!part)
            part = pu_json_str(j, PU_PATH("choices", "0", "message", "content"));
        size_t k = part ? strlen(part) : 0;
        if (len + k + 1 > cap) {
            cap = 2 * (len + k + 1);
            if (!(text = realloc(text, cap)))
                pu_die("out of memory");
        }
        if (k) {
            memcpy(text + len, part, k + 1);
            len += k;
        }
        cJSON_Delete(j);
    }
    return text;
}

/* Send body and wait for its final record: its JSON (owned by the caller),
 * NULL when none came. The records of the stream are checked. */
static cJSON *ask(const char *id, const char *body)
{
    check(pu_client_send(&client, id, body), "%s: produce", id);
    const pu_record *f = pu_client_wait(&client, id, ANSWER_MS);
    check(f != NULL, "%s: no final record within %d ms", id, ANSWER_MS);
    pu_check_stream(&client, id);
    return f ? pu_json(f) : NULL;
}

/* A request with the invoice schema is answered with a valid document. */
static void expect_valid(const char *id, const char *schema, const char *extra,
                         const char *image_part)
{
    char *body = schema_request(id, schema, extra, image_part);
    cJSON *j = ask(id, body);
    const char *reason = pu_finish_reason(j);
    const char *code = pu_error_code(j);
    const char *message = pu_json_str(j, PU_PATH("error", "message"));
    check(reason && !strcmp(reason, "stop"), "%s: finish_reason %s (error %s: %s)", id,
          reason ? reason : "(none)", code ? code : "-", message ? message : "");
    char *text = answer_text(id);
    char why[256] = "";
    check(text && invoice_valid(text, why, sizeof why), "%s: invalid document (%s): %.300s", id,
          why, text ? text : "(none)");
    fprintf(stderr, "%s: %.300s\n", id, text ? text : "(none)");
    free(text);
    cJSON_Delete(j);
    free(body);
}

static void good_request(const char *after)
{
    char id[64];
    snprintf(id, sizeof id, "good-%d", n_good++);
    char *body = pu_chat_request(id, "Hello", NULL, "\"max_tokens\":2");
    cJSON *j = ask(id, body);
    const char *reason = pu_finish_reason(j);
    check(reason && (!strcmp(reason, "stop") || !strcmp(reason, "length")),
          "a good request after %s: finish_reason %s", after, reason ? reason : "(none)");
    cJSON_Delete(j);
    free(body);
}

/* A request with `schema` is refused with invalid_request, its message
 * holding each of `words` (NULL-terminated); then a good request. */
static void expect_refused(const char *id, const char *schema, const char *const *words)
{
    char *body = schema_request(id, schema, "\"max_tokens\":8", NULL);
    cJSON *j = ask(id, body);
    const char *code = pu_error_code(j);
    const char *message = pu_json_str(j, PU_PATH("error", "message"));
    check(code && !strcmp(code, "invalid_request"), "%s: error %s, want invalid_request", id,
          code ? code : "(none)");
    for (const char *const *w = words; *w; w++)
        check(message && strstr(message, *w), "%s: message '%s' lacks '%s'", id,
              message ? message : "", *w);
    fprintf(stderr, "%s -> %s: %s\n", id, code ? code : "(none)", message ? message : "");
    cJSON_Delete(j);
    free(body);
    good_request(id);
}

/* ---- cases ---------------------------------------------------------------------- */

static void test_valid_documents(void)
{
    double compiles0 = pu_metric(port, "mllama_schema_compiles_total");
    double hits0 = pu_metric(port, "mllama_schema_cache_hits_total");
    char *part = pu_image_part(image, image_len);
    char extra[128];
    snprintf(extra, sizeof extra, "\"max_tokens\":%d,\"stream\":false,\"seed\":1", MAX_TOKENS);
    expect_valid("schema-image", INVOICE_SCHEMA, extra, part);
    snprintf(extra, sizeof extra, "\"max_tokens\":%d,\"seed\":2", MAX_TOKENS);
    expect_valid("schema-image-streamed", INVOICE_SCHEMA, extra, part);
    for (int seed = 0; seed < SEEDS; seed++) {
        char id[32];
        snprintf(id, sizeof id, "schema-seed-%d", seed);
        snprintf(extra, sizeof extra,
                 "\"max_tokens\":%d,\"stream\":%s,\"temperature\":1,\"seed\":%d", MAX_TOKENS,
                 seed % 2 ? "true" : "false", 100 + seed);
        expect_valid(id, seed % 2 ? INVOICE_RESPELLED : INVOICE_SCHEMA, extra, NULL);
    }
    double compiles = pu_metric(port, "mllama_schema_compiles_total") - compiles0;
    double hits = pu_metric(port, "mllama_schema_cache_hits_total") - hits0;
    check(compiles == 1 && hits == 1 + SEEDS,
          "one schema in two spellings: %.0f compiles (want 1), %.0f hits (want %d)", compiles,
          hits, 1 + SEEDS);
    check(pu_metric(port, "mllama_schema_cache_bytes") > 0, "mllama_schema_cache_bytes");
    free(part);

    /* Cut short: finish_reason length, the text a start of the document. */
    snprintf(extra, sizeof extra, "\"max_tokens\":%d,\"stream\":false", CUT_TOKENS);
    char *body = schema_request("schema-cut", INVOICE_SCHEMA, extra, NULL);
    cJSON *j = ask("schema-cut", body);
    const char *reason = pu_finish_reason(j);
    const char *text = pu_json_str(j, PU_PATH("choices", "0", "message", "content"));
    check(reason && !strcmp(reason, "length") && text && text[strspn(text, " \t\r\n")] == '{',
          "cut short: finish_reason %s, text '%s'", reason ? reason : "(none)",
          text ? text : "(none)");
    cJSON_Delete(j);
    free(body);
}

static void test_refused(void)
{
    expect_refused("schema-unique-items",
                   "{\"type\":\"object\",\"properties\":{\"tags\":{\"type\":\"array\","
                   "\"uniqueItems\":true}}}",
                   PU_PATH("uniqueItems", "/properties/tags"));
    expect_refused("schema-conditional",
                   "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"string\","
                   "\"if\":{\"maxLength\":3},\"then\":{\"pattern\":\"^a\"}}}}",
                   PU_PATH("if", "/properties/x"));
    expect_refused("schema-bad-type", "{\"type\":\"strnig\"}", PU_PATH("type"));
    /* Over the bound: refused from its size, before it is compiled. */
    char big[MAX_SCHEMA_BYTES + 64];
    int n = snprintf(big, sizeof big, "{\"description\":\"");
    memset(big + n, 'a', MAX_SCHEMA_BYTES);
    snprintf(big + n + MAX_SCHEMA_BYTES, sizeof big - (size_t)n - MAX_SCHEMA_BYTES,
             "\",\"type\":\"string\"}");
    char bound[32];
    snprintf(bound, sizeof bound, "%d bytes", MAX_SCHEMA_BYTES);
    expect_refused("schema-too-large", big, PU_PATH("limits.max_schema_bytes", bound));
    /* The refusals cached nothing in its way: the invoice is still served. */
    char extra[64];
    snprintf(extra, sizeof extra, "\"max_tokens\":%d,\"seed\":9", MAX_TOKENS);
    expect_valid("schema-after-refusals", INVOICE_SCHEMA, extra, NULL);
}

int main(void)
{
    pu_stack_start(&st, "schema", TOPICS);
    char image_sha[ML_SHA256_HEX_SIZE];
    image = pu_slurp_image(IMAGE, &image_len, image_sha);
    char max_schema[64];
    snprintf(max_schema, sizeof max_schema, "limits.max_schema_bytes=%d", MAX_SCHEMA_BYTES);
    const char *extra[] = {max_schema, NULL};
    if (!pu_worker_start(worker, &st.env, "schema", extra))
        pu_die("worker start");
    port = pu_worker_http_port(worker);
    const char *topics[] = {PU_REPLIES};
    pu_client_init(&client, st.brokers, topics, 1);

    int64_t t0 = pu_now_ms();
    test_validator();
    good_request("start");
    test_valid_documents();
    test_refused();
    fprintf(stderr, "schema: %.1f s\n", (pu_now_ms() - t0) / 1000.0);

    int code = pu_stop(worker, PU_STOP_MS);
    check(code == 0, "worker exit code %d after SIGTERM", code);
    pu_check_log_clean(worker->log);
    pu_client_deinit(&client);
    free(image);
    return check_done();
}
