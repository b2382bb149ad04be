/* The worker configuration's model keys that change what the model computes
 * (service/config.c): model.cross_attention_row_mask takes "reference" (the
 * default) or "transformers" from every source (file, environment, --set),
 * and any other value is refused with an error naming the key and the two
 * values; model.weights takes "stored" (the default) or "fp8" (quantize at
 * load), and model.fp8_activations "bf16" (the default, W8A16) or "fp8"
 * (W8A8), and model.cpu_activations "f32" (the default) or "bf16", likewise;
 * model.cpu_kv_cache "f32" (the default) or "bf16" too, independent of
 * model.cpu_activations;
 * model.fp8_lm_head is a boolean, false by default. log.level is "info" by
 * default and takes the four level names from every source. The
 * structured-output limits have their defaults and ranges. Tenants: with none configured there is one, "default", on the
 * kafka section's topics; a "tenants" array gets the documented defaults
 * (topics and reply policy derived from the kafka section and the name,
 * weight 1, max_in_flight 2 x runtime.max_running, cache_group the name,
 * cache_salt sha256("mllama.cache\0" || cache_group)), is found by its
 * request or cancel topic, and is refused (naming the tenant) for a bad
 * name, a duplicate name or topic, a topic shared with the DLT, reply
 * policies of two tenants that overlap, or an unknown key. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "harness.h"

#define KEY "model.cross_attention_row_mask"
#define ENV "MLLAMA_MODEL_CROSS_ATTENTION_ROW_MASK"

/* svc_config_load of path (may be NULL) with one override (may be NULL):
 * returns its rc, the error in err. */
static int load(svc_config *cfg, const char *path, const char *set, char *err, size_t errlen)
{
    const char *sets[] = {set};
    err[0] = 0;
    int rc = svc_config_load(cfg, path, sets, set ? 1 : 0, err, errlen);
    svc_config_deinit(cfg);
    return rc;
}

static void test_values(void)
{
    svc_config cfg;
    char err[512];
    check(load(&cfg, NULL, NULL, err, sizeof err) == 0 &&
              cfg.model.row_mask == ML_ROW_MASK_REFERENCE &&
              !strcmp(cfg.model.cross_attention_row_mask, "reference"),
          "the default is reference: %s", err);
    check(load(&cfg, NULL, KEY "=transformers", err, sizeof err) == 0 &&
              cfg.model.row_mask == ML_ROW_MASK_TRANSFORMERS,
          "--set transformers: %s", err);
    check(load(&cfg, NULL, KEY "=reference", err, sizeof err) == 0 &&
              cfg.model.row_mask == ML_ROW_MASK_REFERENCE,
          "--set reference: %s", err);

    setenv(ENV, "transformers", 1);
    check(load(&cfg, NULL, NULL, err, sizeof err) == 0 &&
              cfg.model.row_mask == ML_ROW_MASK_TRANSFORMERS,
          "environment " ENV ": %s", err);
    check(load(&cfg, NULL, KEY "=reference", err, sizeof err) == 0 &&
              cfg.model.row_mask == ML_ROW_MASK_REFERENCE,
          "--set wins over the environment: %s", err);
    unsetenv(ENV);

    char path[] = "/tmp/mllama-config-XXXXXX";
    int fd = mkstemp(path);
    static const char body[] = "{\"model\": {\"cross_attention_row_mask\": \"transformers\"}}";
    check(fd >= 0 && write(fd, body, sizeof body - 1) == (ssize_t)(sizeof body - 1), "temp file");
    if (fd >= 0)
        close(fd);
    check(load(&cfg, path, NULL, err, sizeof err) == 0 &&
              cfg.model.row_mask == ML_ROW_MASK_TRANSFORMERS,
          "config file: %s", err);
    remove(path);
}

static void test_refused(void)
{
    static const char *const bad[] = {"", "Reference", "transformer", "meta", "reference "};
    svc_config cfg;
    char err[512], set[128], want[128];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(set, sizeof set, KEY "=%s", bad[i]);
        snprintf(want, sizeof want, KEY ": expected reference or transformers, got '%s'", bad[i]);
        int rc = load(&cfg, NULL, set, err, sizeof err);
        check(rc == -1 && strstr(err, want), "'%s' refused: %s", bad[i], rc ? err : "accepted");
    }
    setenv(ENV, "vllm", 1);
    int rc = load(&cfg, NULL, NULL, err, sizeof err);
    check(rc == -1 && strstr(err, KEY ": expected reference or transformers, got 'vllm'"),
          "a bad environment value refused: %s", rc ? err : "accepted");
    unsetenv(ENV);
    snprintf(set, sizeof set, KEY "=%040d", 0);
    rc = load(&cfg, NULL, set, err, sizeof err);
    check(rc == -1 && strstr(err, KEY), "an over-long value refused naming the key: %s",
          rc ? err : "accepted");
}

static void test_weights(void)
{
    svc_config cfg;
    char err[512];
    check(load(&cfg, NULL, NULL, err, sizeof err) == 0 && cfg.model.quantize_fp8 == 0 &&
              !strcmp(cfg.model.weights, "stored"),
          "model.weights defaults to stored: %s", err);
    check(load(&cfg, NULL, "model.weights=fp8", err, sizeof err) == 0 &&
              cfg.model.quantize_fp8 == 1,
          "model.weights=fp8: %s", err);
    int rc = load(&cfg, NULL, "model.weights=int8", err, sizeof err);
    check(rc == -1 && strstr(err, "model.weights: expected stored or fp8, got 'int8'"),
          "model.weights=int8 refused: %s", rc ? err : "accepted");
    check(load(&cfg, NULL, NULL, err, sizeof err) == 0 && cfg.model.quant_activations == 0 &&
              !strcmp(cfg.model.fp8_activations, "bf16"),
          "model.fp8_activations defaults to bf16: %s", err);
    check(load(&cfg, NULL, "model.fp8_activations=fp8", err, sizeof err) == 0 &&
              cfg.model.quant_activations == 1,
          "model.fp8_activations=fp8: %s", err);
    rc = load(&cfg, NULL, "model.fp8_activations=int8", err, sizeof err);
    check(rc == -1 && strstr(err, "model.fp8_activations: expected bf16 or fp8, got 'int8'"),
          "model.fp8_activations=int8 refused: %s", rc ? err : "accepted");
    check(load(&cfg, NULL, NULL, err, sizeof err) == 0 && cfg.model.fp8_lm_head == 0,
          "model.fp8_lm_head defaults to false: %s", err);
    check(load(&cfg, NULL, "model.fp8_lm_head=true", err, sizeof err) == 0 &&
              cfg.model.fp8_lm_head == 1,
          "model.fp8_lm_head=true: %s", err);
    rc = load(&cfg, NULL, "model.fp8_lm_head=fp8", err, sizeof err);
    check(rc == -1 && strstr(err, "model.fp8_lm_head=fp8: expected true or false"),
          "model.fp8_lm_head=fp8 refused: %s", rc ? err : "accepted");
    check(load(&cfg, NULL, NULL, err, sizeof err) == 0 && cfg.model.cpu_bf16_activations == 0 &&
              !strcmp(cfg.model.cpu_activations, "f32"),
          "model.cpu_activations defaults to f32: %s", err);
    check(load(&cfg, NULL, "model.cpu_activations=bf16", err, sizeof err) == 0 &&
              cfg.model.cpu_bf16_activations == 1,
          "model.cpu_activations=bf16: %s", err);
    rc = load(&cfg, NULL, "model.cpu_activations=fp16", err, sizeof err);
    check(rc == -1 && strstr(err, "model.cpu_activations: expected f32 or bf16, got 'fp16'"),
          "model.cpu_activations=fp16 refused: %s", rc ? err : "accepted");
    check(load(&cfg, NULL, NULL, err, sizeof err) == 0 && cfg.model.cpu_bf16_kv_cache == 0 &&
              !strcmp(cfg.model.cpu_kv_cache, "f32"),
          "model.cpu_kv_cache defaults to f32: %s", err);
    check(load(&cfg, NULL, "model.cpu_kv_cache=bf16", err, sizeof err) == 0 &&
              cfg.model.cpu_bf16_kv_cache == 1 && cfg.model.cpu_bf16_activations == 0,
          "model.cpu_kv_cache=bf16 (cpu_activations stays f32): %s", err);
    rc = load(&cfg, NULL, "model.cpu_kv_cache=fp8", err, sizeof err);
    check(rc == -1 && strstr(err, "model.cpu_kv_cache: expected f32 or bf16, got 'fp8'"),
          "model.cpu_kv_cache=fp8 refused: %s", rc ? err : "accepted");
}

static void test_log_level(void)
{
    svc_config cfg;
    char err[512];
    check(load(&cfg, NULL, NULL, err, sizeof err) == 0 && cfg.log.threshold == SVC_LOG_INFO,
          "log.level defaults to info: %s", err);
    check(load(&cfg, NULL, "log.level=debug", err, sizeof err) == 0 &&
              cfg.log.threshold == SVC_LOG_DEBUG,
          "log.level=debug: %s", err);
    setenv("MLLAMA_LOG_LEVEL", "error", 1);
    check(load(&cfg, NULL, NULL, err, sizeof err) == 0 && cfg.log.threshold == SVC_LOG_ERROR,
          "MLLAMA_LOG_LEVEL=error: %s", err);
    unsetenv("MLLAMA_LOG_LEVEL");
    const int rc = load(&cfg, NULL, "log.level=verbose", err, sizeof err);
    check(rc == -1 && strstr(err, "log.level: expected debug, info, warn or error, got 'verbose'"),
          "log.level=verbose refused: %s", rc ? err : "accepted");
}

/* limits.max_tokens: 4096 by default, the request parser's bound, and at
 * least the default a request without max_tokens gets. */
static void test_max_tokens(void)
{
    svc_config cfg;
    char err[512];
    check(load(&cfg, NULL, NULL, err, sizeof err) == 0 &&
              cfg.limits.max_tokens == SVC_MAX_TOKENS_DEFAULT,
          "limits.max_tokens defaults to %d: %s", SVC_MAX_TOKENS_DEFAULT, err);
    check(load(&cfg, NULL, "limits.max_tokens=32768", err, sizeof err) == 0 &&
              cfg.limits.max_tokens == 32768,
          "limits.max_tokens=32768: %s", err);
    const int rc = load(&cfg, NULL, "limits.max_tokens=100", err, sizeof err);
    check(rc == -1 && strstr(err, "runtime.default_max_tokens (256) must be <= limits.max_tokens (100)"),
          "limits.max_tokens below the default refused: %s", rc ? err : "accepted");
}

/* The structured-output limits: the embedded defaults (config/README.md
 * "Keys"), and each key's range named when refused. */
static void test_schema_limits(void)
{
    svc_config cfg;
    char err[512];
    check(load(&cfg, NULL, NULL, err, sizeof err) == 0 &&
              cfg.limits.max_schema_bytes == 262144 && cfg.limits.max_schema_states == 200000 &&
              cfg.limits.max_schema_compile_ms == 2000 && cfg.limits.schema_cache_entries == 256 &&
              cfg.limits.schema_cache_bytes == 268435456L,
          "schema limits: the defaults of config/local.json: %s", err);
    check(load(&cfg, NULL, "limits.schema_cache_entries=0", err, sizeof err) == 0 &&
              cfg.limits.schema_cache_entries == 0,
          "a cache of no entries (every request compiles): %s", err);
    static const char *const refused[] = {
        "limits.max_schema_bytes=8",          "limits.max_schema_bytes=1000000000",
        "limits.max_schema_states=0",         "limits.max_schema_compile_ms=0",
        "limits.schema_cache_entries=100000", "limits.schema_cache_bytes=-1",
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        char key[64];
        snprintf(key, sizeof key, "%.*s", (int)strcspn(refused[i], "="), refused[i]);
        check(load(&cfg, NULL, refused[i], err, sizeof err) != 0 && strstr(err, key),
              "%s refused naming the key: %s", refused[i], err);
    }
}

/* Load a config file holding `body` (and one override, may be NULL); the
 * caller deinits cfg. Returns svc_config_load's rc. */
static int load_body(svc_config *cfg, const char *body, const char *set, char *err,
                     size_t errlen)
{
    char path[] = "/tmp/mllama-config-XXXXXX";
    int fd = mkstemp(path);
    size_t n = strlen(body);
    check(fd >= 0 && write(fd, body, n) == (ssize_t)n, "temp file");
    if (fd >= 0)
        close(fd);
    const char *sets[] = {set};
    err[0] = 0;
    int rc = svc_config_load(cfg, path, sets, set ? 1 : 0, err, errlen);
    remove(path);
    return rc;
}

static bool salt_is(const svc_tenant *t, const char *group)
{
    uint8_t want[ML_SHA256_DIGEST_SIZE];
    ml_sha256_ctx ctx;
    ml_sha256_init(&ctx);
    ml_sha256_update(&ctx, "mllama.cache", sizeof "mllama.cache"); /* the NUL too */
    ml_sha256_update(&ctx, group, strlen(group));
    ml_sha256_final(&ctx, want);
    return !memcmp(t->cache_salt, want, sizeof want);
}

static void test_tenants_implicit(void)
{
    svc_config cfg;
    char err[512];
    check(svc_config_load(&cfg, NULL, NULL, 0, err, sizeof err) == 0, "defaults: %s", err);
    const svc_tenant *t = cfg.n_tenants == 1 ? &cfg.tenants[0] : NULL;
    check(t && !strcmp(t->name, "default") && !strcmp(t->request_topic, "mllama.requests") &&
              !strcmp(t->cancel_topic, "mllama.cancel") &&
              !strcmp(t->reply_topics, "mllama.replies,mllama.replies.*") && t->weight == 1 &&
              t->max_in_flight == 2 * cfg.runtime.max_running &&
              !strcmp(t->cache_group, "default") && salt_is(t, "default"),
          "no tenants: the implicit tenant on the kafka section's topics");
    check(t && svc_config_tenant_by_topic(&cfg, "mllama.requests") == t &&
              svc_config_tenant_by_topic(&cfg, "mllama.cancel") == t &&
              !svc_config_tenant_by_topic(&cfg, "mllama.replies") &&
              !svc_config_tenant_by_topic(&cfg, "mllama.dlt"),
          "the implicit tenant found by its request and cancel topics only");
    check(t && svc_reply_topic_allowed(&t->policy, "mllama.replies.x", 16) &&
              !svc_reply_topic_allowed(&t->policy, "mllama.cancel", 13),
          "the implicit tenant's policy is kafka.reply_topics");
    svc_config_deinit(&cfg);
}

static void test_tenants_configured(void)
{
    static const char body[] =
        "{\"tenants\": [{\"name\": \"acme\"},"
        " {\"name\": \"beta-2\", \"weight\": 3, \"max_in_flight\": 5,"
        "  \"request_topic\": \"beta.in\", \"cancel_topic\": \"beta.stop\","
        "  \"reply_topics\": \"beta.out\", \"cache_group\": \"shared\"}]}";
    svc_config cfg;
    char err[512];
    check(load_body(&cfg, body, "runtime.max_running=7", err, sizeof err) == 0, "two tenants: %s",
          err);
    const svc_tenant *a = cfg.n_tenants == 2 ? &cfg.tenants[0] : NULL;
    const svc_tenant *b = a ? &cfg.tenants[1] : NULL;
    check(a && !strcmp(a->name, "acme") && !strcmp(a->request_topic, "mllama.requests.acme") &&
              !strcmp(a->cancel_topic, "mllama.cancel.acme") &&
              !strcmp(a->reply_topics, "mllama.replies.acme,mllama.replies.acme.*") &&
              a->weight == 1 && a->max_in_flight == 14 && !strcmp(a->cache_group, "acme") &&
              salt_is(a, "acme"),
          "acme: every default derived from the kafka section and its name");
    check(b && b->weight == 3 && b->max_in_flight == 5 && !strcmp(b->request_topic, "beta.in") &&
              !strcmp(b->cancel_topic, "beta.stop") && !strcmp(b->reply_topics, "beta.out") &&
              salt_is(b, "shared"),
          "beta-2: every key as given");
    check(b && svc_config_tenant_by_topic(&cfg, "beta.stop") == b &&
              svc_config_tenant_by_topic(&cfg, "mllama.requests.acme") == a &&
              !svc_config_tenant_by_topic(&cfg, "mllama.requests"),
          "tenants found by their topics; the kafka section's own topic is no tenant's");
    check(a && b && svc_reply_topic_allowed(&a->policy, "mllama.replies.acme.ui", 22) &&
              !svc_reply_topic_allowed(&a->policy, "beta.out", 8) &&
              !svc_reply_topic_allowed(&b->policy, "mllama.replies.acme", 19) &&
              !svc_reply_topic_allowed(&a->policy, "mllama.replies", 14),
          "each tenant's policy allows its own reply topics only");
    check(a && !svc_reply_topic_allowed(&a->policy, "mllama.replies.acme", 0),
          "an empty topic is refused");
    svc_config_deinit(&cfg);

    /* The same array from --set and from the environment (a container's
     * configuration), a later source replacing an earlier one. */
    static const char set[] = "tenants=[{\"name\": \"gamma\", \"cancel_topic\": \"g.c\"}]";
    const char *sets[] = {set};
    setenv("MLLAMA_TENANTS", "[{\"name\": \"delta\"}, {\"name\": \"eps\"}]", 1);
    check(svc_config_load(&cfg, NULL, NULL, 0, err, sizeof err) == 0 && cfg.n_tenants == 2 &&
              !strcmp(cfg.tenants[1].request_topic, "mllama.requests.eps"),
          "MLLAMA_TENANTS: %s", err);
    svc_config_deinit(&cfg);
    check(svc_config_load(&cfg, NULL, sets, 1, err, sizeof err) == 0 && cfg.n_tenants == 1 &&
              !strcmp(cfg.tenants[0].name, "gamma") && !strcmp(cfg.tenants[0].cancel_topic, "g.c"),
          "--set tenants= wins over the environment: %s", err);
    svc_config_deinit(&cfg);
    setenv("MLLAMA_TENANTS", "[{\"name\": ", 1);
    check(svc_config_load(&cfg, NULL, NULL, 0, err, sizeof err) == -1 &&
              strstr(err, "environment MLLAMA_TENANTS: tenants: expected an array"),
          "a malformed MLLAMA_TENANTS refused: %s", err);
    svc_config_deinit(&cfg);
    unsetenv("MLLAMA_TENANTS");
}

static void test_tenants_refused(void)
{
    static const struct {
        const char *body, *want;
    } bad[] = {
        {"{\"tenants\": [{\"name\": \"Acme\"}]}", "tenants[0].name: expected [a-z0-9_-]"},
        {"{\"tenants\": [{}]}", "tenants[0].name"},
        {"{\"tenants\": []}", "tenants: expected an array"},
        {"{\"tenants\": {\"name\": \"a\"}}", "tenants: expected an array"},
        {"{\"tenants\": [{\"name\": \"a\", \"colour\": \"red\"}]}",
         "tenants[0].colour: unknown key"},
        {"{\"tenants\": [{\"name\": \"a\", \"weight\": 0}]}", "tenants[0].weight"},
        {"{\"tenants\": [{\"name\": \"a\"}, {\"name\": \"a\"}]}", "both named 'a'"},
        {"{\"tenants\": [{\"name\": \"a\"}, {\"name\": \"b\", "
         "\"request_topic\": \"mllama.cancel.a\"}]}",
         "share the topic 'mllama.cancel.a'"},
        {"{\"tenants\": [{\"name\": \"a\", \"cancel_topic\": \"mllama.dlt\"}]}",
         "topic 'mllama.dlt' is used twice"},
        {"{\"tenants\": [{\"name\": \"a\"}, {\"name\": \"b\", "
         "\"reply_topics\": \"mllama.replies.*\"}]}",
         "reply topics overlap"},
        {"{\"tenants\": [{\"name\": \"a\", \"reply_topics\": \"x\"}, {\"name\": \"b\", "
         "\"reply_topics\": \"y,x\"}]}",
         "reply topics overlap ('x' and 'x')"},
        {"{\"tenants\": [{\"name\": \"a\", \"reply_topics\": \"mllama.requests.b\"}, "
         "{\"name\": \"b\"}]}",
         "tenants[0] (a).reply_topics"},
        {"{\"tenants\": [{\"name\": \"a\", \"cache_group\": \"A B\"}]}",
         "cache_group: expected"},
    };
    svc_config cfg;
    char err[512];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = load_body(&cfg, bad[i].body, NULL, err, sizeof err);
        check(rc == -1 && strstr(err, bad[i].want), "%s refused (%s): %s", bad[i].body,
              bad[i].want, rc ? err : "accepted");
        svc_config_deinit(&cfg);
    }
}

int main(void)
{
    unsetenv(ENV);
    test_values();
    test_refused();
    test_weights();
    test_max_tokens();
    test_log_level();
    test_schema_limits();
    test_tenants_implicit();
    test_tenants_configured();
    test_tenants_refused();
    return check_done();
}
