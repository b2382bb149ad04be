/* The worker configuration's model keys that change what the model computes
 * (service/config.c): model.cross_attention_row_mask takes "reference" (the
 * default) or "transformers" from every source (file, environment, --set),
 * and any other value is refused with an error naming the key and the two
 * values; model.weights takes "stored" (the default) or "fp8" (quantize at
 * load), and model.fp8_activations "bf16" (the default, W8A16) or "fp8"
 * (W8A8), likewise. The structured-output limits have their defaults and
 * ranges. */
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
}

/* The structured-output limits: the embedded defaults (README.md
 * "Configuration"), and each key's range named when refused. */
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

int main(void)
{
    unsetenv(ENV);
    test_values();
    test_refused();
    test_weights();
    test_schema_limits();
    return check_done();
}
